// ckpt/preemption.h: using the grace period between a scheduler's SIGTERM
// and its SIGKILL to finish the checkpoints in flight and take a final one.
//
//   ckpt::PreemptionOptions p;           // SIGTERM, 25 s (Slurm's KillWait and
//   auto watch = ckpt::PreemptionWatch::Install(p);  // Kubernetes' grace: 30 s)
//   if (!watch.ok()) return watch.status();
//   for (int64_t step = 0;; ++step) {
//     TrainStep();
//     if ((*watch)->preempted()) {           // at a step boundary
//       engine->Save(step, tensors);         // final save, synchronous
//       break;                               // Close waits for the rest
//     }
//     if (step % 100 == 0) engine->SaveAsync(step, tensors);
//   }
//
// Opt-in and process-wide (signal dispositions are): without a watch,
// signals do what they did. With one, the listed signals no longer end the
// process at once. Their handler only records the signal and its time
// (atomics) and writes to an eventfd -- it allocates nothing and takes no
// lock, so it is safe whatever thread it interrupts, engine threads holding
// their locks included -- then calls the handler that was installed before,
// if that was a function (a disposition of SIG_DFL or SIG_IGN is not
// re-run). From then on:
// * the training loop sees `preempted()` and may take a final save; saves
//   in flight keep going, and commit in order before it;
// * at the deadline (the signal's arrival + `grace`), every engine of the
//   process abandons what is not durable yet: those saves fail with
//   kDeadlineExceeded, their temp directories are removed, and the previous
//   checkpoint stays the latest; later saves fail at once;
// * then, if `end_process_at_deadline` and the earlier disposition was
//   SIG_DFL, the process ends as the signal would have ended it (killed by
//   it: the exit status a scheduler expects), as soon as the abandoned
//   saves are cleaned up (at most `cleanup_allowance` later);
// * a second listed signal during the grace ends the process at once (when
//   the earlier disposition was SIG_DFL): an operator insisting. What was
//   in flight stays a `.tmp-step-*` directory, which the next writer to open
//   the root removes.
// A process that finishes its final save and exits before the deadline
// exits as it would have. One watch may be installed at a time.
#ifndef CKPT_PREEMPTION_H_
#define CKPT_PREEMPTION_H_

#include <csignal>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ckpt {

struct PreemptionOptions {
  // Which signals announce a preemption (each in 1..64, none of SIGKILL,
  // SIGSTOP, or a signal the process cannot survive: SIGSEGV, SIGBUS,
  // SIGFPE, SIGILL, SIGABRT).
  std::vector<int> signals = {SIGTERM};
  // From the first signal to the deadline. Leave the cleanup allowance and
  // a margin before the scheduler's SIGKILL (Slurm: KillWait, default 30 s;
  // Kubernetes: terminationGracePeriodSeconds, default 30 s).
  absl::Duration grace = absl::Seconds(25);
  // At the deadline, end the process once the abandoned saves are cleaned
  // up (see above). False: the engines abandon their saves and the process
  // goes on (it decides itself when to exit).
  bool end_process_at_deadline = true;
  // How long, past the deadline, the abandoned saves may take to remove
  // their temp directories before the process ends anyway.
  absl::Duration cleanup_allowance = absl::Seconds(3);
};

class PreemptionWatch {
 public:
  // Installs the handlers (sigaction, SA_RESTART) and starts the thread that
  // enforces the deadline. kInvalidArgument for a signal it may not watch or
  // a grace that is not positive; kFailedPrecondition while another watch is
  // installed.
  static absl::StatusOr<std::unique_ptr<PreemptionWatch>> Install(const PreemptionOptions& options);
  // Puts the earlier handlers back and stops the thread. A deadline that
  // has passed stays in force for the engines (their saves stay abandoned).
  ~PreemptionWatch();
  PreemptionWatch(const PreemptionWatch&) = delete;
  PreemptionWatch& operator=(const PreemptionWatch&) = delete;

  // True once a listed signal arrived. Never blocks (an atomic load).
  bool preempted() const;
  // The first signal that arrived, or 0.
  int signal() const;
  // When the grace runs out; absl::InfiniteFuture() until preempted.
  absl::Time deadline() const;
  // Until the deadline (zero once it passed); infinite until preempted.
  absl::Duration remaining() const;
  // Blocks until preempted or `timeout` passed; returns `preempted()`.
  bool WaitFor(absl::Duration timeout) const;
  // An eventfd that turns readable once preempted, for poll/epoll loops.
  // Owned by the watch; do not read from it.
  int event_fd() const;
  const PreemptionOptions& options() const { return options_; }

 private:
  explicit PreemptionWatch(PreemptionOptions options) : options_(std::move(options)) {}
  const PreemptionOptions options_;
};

}  // namespace ckpt

#endif  // CKPT_PREEMPTION_H_
