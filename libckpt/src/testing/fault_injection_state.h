// What `FaultInjectionFileSystem` shares with its files and queues: the call
// count, the armed fault, the slow or hung "disk", and the power-loss log.
#ifndef CKPT_TESTING_FAULT_INJECTION_STATE_H_
#define CKPT_TESTING_FAULT_INJECTION_STATE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "testing/fault_injection_file_system.h"
#include "testing/fault_injection_log.h"
#include "util/mutex.h"

namespace ckpt::testing {

class FaultInjectionFileSystem::State {
 public:
  explicit State(std::shared_ptr<FileSystem> base) : log_(std::move(base)) {}

  // Counts one call and returns the fault to inject into it (kNone for none).
  // `transfer` says whether the call moves data (an `IoOp`, `ReadAt` or
  // `WriteAt`): only those take kShortTransfer and kEintr. `describe` names
  // the call; it runs only when a fault fires or calls are recorded.
  Fault OnCall(bool transfer, absl::FunctionRef<std::string()> describe) ABSL_LOCKS_EXCLUDED(mu_);

  // What the "disk" does before `ops` transfers start: blocks while I/O is
  // held (a hung disk, counting the held callers), then waits the I/O delay
  // once per transfer (a slow disk).
  void BeforeTransfers(size_t ops) ABSL_LOCKS_EXCLUDED(mu_);

  mutable internal::Mutex mu_;
  uint64_t count_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t fail_at_ ABSL_GUARDED_BY(mu_) = 0;
  Fault fault_ ABSL_GUARDED_BY(mu_) = Fault::kNone;
  bool crashed_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t injected_ ABSL_GUARDED_BY(mu_) = 0;
  bool record_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::string> recorded_ ABSL_GUARDED_BY(mu_);
  std::string first_injected_ ABSL_GUARDED_BY(mu_);
  absl::Duration io_delay_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  bool io_held_ ABSL_GUARDED_BY(mu_) = false;
  size_t io_held_waiters_ ABSL_GUARDED_BY(mu_) = 0;
  bool exchange_supported_ ABSL_GUARDED_BY(mu_) = true;
  fault_internal::DurabilityLog log_ ABSL_GUARDED_BY(mu_);
};

namespace fault_internal {

using State = FaultInjectionFileSystem::State;

// The status an injected kEio, kEnospc or kCrash gives a call that returns a
// status (OK for the other faults). `what` names the call and its path, e.g.
// "rename /a to /b".
absl::Status FaultStatus(Fault fault, const std::string& what);

// Counts a call that is not a transfer; returns the status it must fail
// with, or OK to let it proceed.
absl::Status Check(State& state, const std::string& what);

// The length of a short transfer of `length` bytes, or 0 if there is none:
// a positive multiple of 4096 for O_DIRECT (`direct`), else at least 1 byte;
// less than `length` either way.
size_t ShortLength(size_t length, bool direct);

}  // namespace fault_internal

#define CKPT_FAULT_CHECK(state, what)                                       \
  do {                                                                      \
    absl::Status fault_status_ = ::ckpt::testing::fault_internal::Check(state, what); \
    if (!fault_status_.ok()) return fault_status_;                          \
  } while (false)

}  // namespace ckpt::testing

#endif  // CKPT_TESTING_FAULT_INJECTION_STATE_H_
