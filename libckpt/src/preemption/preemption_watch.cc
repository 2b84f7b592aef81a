// PreemptionWatch (ckpt/preemption.h): the signal handler, which only
// records, and the thread that enforces the deadline.
//
// Everything the handler touches is a lock-free atomic or memory written
// before the handler was installed (the earlier dispositions); the system
// calls it makes (clock_gettime, write, sigaction, raise) are on POSIX's
// async-signal-safe list.
#include "ckpt/preemption.h"

#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "preemption/preemption_state.h"
#include "util/background_thread.h"
#include "util/errno_status.h"
#include "util/log.h"

namespace ckpt {
namespace internal {
namespace {

constexpr int kMaxSignal = 64;

static_assert(std::atomic<int64_t>::is_always_lock_free);
static_assert(std::atomic<int>::is_always_lock_free);

// The process's one watch (signal dispositions are process-wide).
struct WatchState {
  // 0: none; 1: claimed by the first signal, deadline being written;
  // 2: deadline published. Only the handler moves it on.
  std::atomic<int> phase{0};
  std::atomic<int> signal{0};
  std::atomic<int64_t> deadline_ns{0};  // CLOCK_MONOTONIC
  std::atomic<int64_t> grace_ns{0};     // set by Install, read by the handler
  std::atomic<int> event_fd{-1};        // written once preempted, never read
  std::atomic<bool> watching[kMaxSignal + 1] = {};
  // The dispositions before ours: written by Install before the handler is
  // installed for that signal, read-only while it is.
  struct sigaction earlier[kMaxSignal + 1];
  std::atomic<bool> installed{false};
  std::atomic<int> saves_in_flight{0};
};

WatchState& State() {
  static WatchState* const state = new WatchState();  // never destroyed: handlers may run at exit
  return *state;
}

int64_t MonotonicNs() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

bool IsDefault(const struct sigaction& a) {
  return (a.sa_flags & SA_SIGINFO) == 0 && a.sa_handler == SIG_DFL;
}

// Ends the process as signal `sig` does by default. Async-signal-safe.
void DieBy(int sig) {
  struct sigaction dfl;
  std::memset(&dfl, 0, sizeof(dfl));
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ::sigaction(sig, &dfl, nullptr);
  // kill, not raise: the calling thread may block `sig` (the watch's thread
  // does); any thread that does not takes it.
  ::kill(::getpid(), sig);
}

void OnSignal(int sig, siginfo_t* info, void* context) {
  const int saved_errno = errno;
  WatchState& s = State();
  if (sig > 0 && sig <= kMaxSignal && s.watching[sig].load(std::memory_order_acquire)) {
    int none = 0;
    if (s.phase.compare_exchange_strong(none, 1, std::memory_order_acq_rel)) {
      s.deadline_ns.store(MonotonicNs() + s.grace_ns.load(std::memory_order_relaxed),
                          std::memory_order_relaxed);
      s.signal.store(sig, std::memory_order_relaxed);
      s.phase.store(2, std::memory_order_release);
      const uint64_t one = 1;
      const int fd = s.event_fd.load(std::memory_order_acquire);
      if (fd >= 0) (void)!::write(fd, &one, sizeof(one));
    } else if (IsDefault(s.earlier[sig])) {
      // A second one: the operator insists. (Delivered once this returns.)
      DieBy(sig);
      errno = saved_errno;
      return;
    }
  }
  const struct sigaction& earlier = s.earlier[sig];
  if ((earlier.sa_flags & SA_SIGINFO) != 0) {
    if (earlier.sa_sigaction != nullptr) earlier.sa_sigaction(sig, info, context);
  } else if (earlier.sa_handler != SIG_DFL && earlier.sa_handler != SIG_IGN) {
    earlier.sa_handler(sig);
  }
  errno = saved_errno;
}

bool Forbidden(int sig) {
  switch (sig) {
    case SIGKILL: case SIGSTOP: case SIGSEGV: case SIGBUS: case SIGFPE: case SIGILL: case SIGABRT:
      return true;
    default:
      return false;
  }
}

// The thread that enforces the deadline: the watch's one thread, stopped by
// `stop_fd`. Blocks every signal, so that the handler never runs on it.
class DeadlineThread {
 public:
  DeadlineThread(PreemptionOptions options, int stop_fd)
      : options_(std::move(options)), stop_fd_(stop_fd) {
    thread_ = std::thread([this] { Run(); });
  }
  ~DeadlineThread() {
    const uint64_t one = 1;
    (void)!::write(stop_fd_, &one, sizeof(one));
    thread_.join();
  }

 private:
  // Waits for `fd` (or `stop_fd_`) to turn readable until `until_ns`
  // (monotonic; 0: forever). False if stopped.
  bool Await(int fd, int64_t until_ns) {
    for (;;) {
      int timeout_ms = -1;
      if (until_ns > 0) {
        const int64_t left = until_ns - MonotonicNs();
        if (left <= 0) return true;
        timeout_ms = static_cast<int>(std::min<int64_t>((left + 999'999) / 1'000'000, 60'000));
      }
      pollfd fds[2] = {{stop_fd_, POLLIN, 0}, {fd, POLLIN, 0}};
      const int n = ::poll(fds, fd >= 0 ? 2 : 1, timeout_ms);
      if (n < 0 && errno != EINTR) return true;
      if (n > 0 && (fds[0].revents & POLLIN) != 0) return false;
      if (n > 0 && fd >= 0 && (fds[1].revents & POLLIN) != 0) return true;
    }
  }

  void Run() {
    sigset_t all;
    sigfillset(&all);
    ::pthread_sigmask(SIG_BLOCK, &all, nullptr);
    BecomeBackgroundThread("ckpt-preempt", 0);
    WatchState& s = State();
    if (!Await(s.event_fd.load(), 0)) return;
    const int sig = s.signal.load();
    Log(LogLevel::kWarning,
        absl::StrCat(SignalName(sig), " received: saves in flight go on; every save must be durable within ",
                     absl::FormatDuration(options_.grace), ", or it is abandoned",
                     options_.end_process_at_deadline && IsDefault(s.earlier[sig])
                         ? " and the process ends"
                         : ""));
    if (!options_.end_process_at_deadline || !IsDefault(s.earlier[sig])) return;
    const int64_t deadline = s.deadline_ns.load();
    if (!Await(-1, deadline)) return;
    const int64_t allowance_end = deadline + absl::ToInt64Nanoseconds(options_.cleanup_allowance);
    for (;;) {
      if (s.saves_in_flight.load() <= 0) break;
      if (MonotonicNs() >= allowance_end) break;
      if (!Await(-1, std::min(allowance_end, MonotonicNs() + 10'000'000))) return;
    }
    const int left = s.saves_in_flight.load();
    Log(LogLevel::kError,
        absl::StrCat("preemption grace of ", absl::FormatDuration(options_.grace), " ran out",
                     left > 0 ? absl::StrCat(" (", left, " abandoned saves still cleaning up)") : "",
                     ": ending the process by ", SignalName(sig)));
    DieBy(sig);
    // Every thread blocks it (unusual): end the process anyway.
    absl::SleepFor(absl::Seconds(1));
    ::_exit(128 + sig);
  }

  const PreemptionOptions options_;
  const int stop_fd_;
  std::thread thread_;
};

// The installed watch's resources (one at a time).
struct Installed {
  int event_fd = -1;  // made by the first Install, kept for the process's life
  int stop_fd = -1;
  std::unique_ptr<DeadlineThread> thread;
};

Installed& TheInstalled() {
  static Installed* const installed = new Installed();
  return *installed;
}

}  // namespace

std::string SignalName(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev != nullptr ? absl::StrCat("SIG", abbrev) : absl::StrCat("signal ", sig);
}

std::optional<std::chrono::steady_clock::time_point> PreemptionDeadline() {
  WatchState& s = State();
  if (s.phase.load(std::memory_order_acquire) != 2) return std::nullopt;
  // steady_clock is CLOCK_MONOTONIC in libstdc++ and libc++ on Linux.
  return std::chrono::steady_clock::time_point(
      std::chrono::nanoseconds(s.deadline_ns.load(std::memory_order_relaxed)));
}

bool PreemptionDeadlinePassed() {
  const auto deadline = PreemptionDeadline();
  return deadline.has_value() && std::chrono::steady_clock::now() >= *deadline;
}

std::string PreemptionGraceRanOut() {
  return absl::StrCat("the preemption grace after ", SignalName(PreemptionSignal()), " ran out");
}

int PreemptionSignal() {
  WatchState& s = State();
  return s.phase.load(std::memory_order_acquire) == 2 ? s.signal.load(std::memory_order_relaxed) : 0;
}

void AddProcessSavesInFlight(int delta) { State().saves_in_flight.fetch_add(delta); }
int ProcessSavesInFlight() { return State().saves_in_flight.load(); }

}  // namespace internal

absl::StatusOr<std::unique_ptr<PreemptionWatch>> PreemptionWatch::Install(
    const PreemptionOptions& options) {
  using internal::State;
  if (options.signals.empty()) return absl::InvalidArgumentError("preemption: no signals to watch");
  for (int sig : options.signals) {
    if (sig < 1 || sig > internal::kMaxSignal || internal::Forbidden(sig)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "preemption: cannot watch signal ", sig,
          " (only 1..64 that a process survives; not SIGKILL, SIGSTOP, SIGSEGV, SIGBUS, SIGFPE, "
          "SIGILL or SIGABRT)"));
    }
  }
  if (!(options.grace > absl::ZeroDuration()) || options.grace == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("preemption: grace ", absl::FormatDuration(options.grace), " is not a positive, finite time"));
  }
  if (options.cleanup_allowance < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("preemption: cleanup_allowance is negative");
  }
  internal::WatchState& s = State();
  bool expected = false;
  if (!s.installed.compare_exchange_strong(expected, true)) {
    return absl::FailedPreconditionError("preemption: a watch is installed already (one per process)");
  }
  if (s.phase.load() != 0) {
    s.installed.store(false);
    return absl::FailedPreconditionError(absl::StrCat(
        "preemption: this process was preempted already (by ",
        internal::SignalName(s.signal.load()), "); its deadline stays in force"));
  }
  internal::Installed& in = internal::TheInstalled();
  // The eventfd is made once and never closed: a handler that loaded it
  // just before an uninstall may still write to it, which must never land
  // in a file that reused the number.
  if (in.event_fd < 0) in.event_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  in.stop_fd = ::eventfd(0, EFD_CLOEXEC);
  if (in.event_fd < 0 || in.stop_fd < 0) {
    const int err = errno;
    if (in.stop_fd >= 0) ::close(in.stop_fd);
    in.stop_fd = -1;
    s.installed.store(false);
    return internal::ErrnoToStatus(err, "preemption: eventfd");
  }
  s.grace_ns.store(absl::ToInt64Nanoseconds(options.grace));
  s.event_fd.store(in.event_fd, std::memory_order_release);
  std::unique_ptr<PreemptionWatch> watch(new PreemptionWatch(options));
  in.thread = std::make_unique<internal::DeadlineThread>(options, in.stop_fd);
  for (int sig : options.signals) {
    if (s.watching[sig].load()) continue;  // listed twice
    struct sigaction ours;
    std::memset(&ours, 0, sizeof(ours));
    ours.sa_sigaction = internal::OnSignal;
    ours.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&ours.sa_mask);
    // The earlier disposition is read before ours is in place, and ours
    // reads it only while `watching`.
    if (::sigaction(sig, nullptr, &s.earlier[sig]) != 0 ||
        (s.watching[sig].store(true, std::memory_order_release), ::sigaction(sig, &ours, nullptr)) != 0) {
      const int err = errno;
      watch.reset();  // puts back what was installed
      return internal::ErrnoToStatus(err, absl::StrCat("preemption: sigaction(", sig, ")"));
    }
  }
  internal::Log(internal::LogLevel::kInfo,
                absl::StrCat("preemption: watching ",
                             absl::StrJoin(options.signals, ", ",
                                           [](std::string* out, int sig) {
                                             absl::StrAppend(out, internal::SignalName(sig));
                                           }),
                             " with a grace of ", absl::FormatDuration(options.grace)));
  return watch;
}

PreemptionWatch::~PreemptionWatch() {
  internal::WatchState& s = internal::State();
  for (int sig = 1; sig <= internal::kMaxSignal; ++sig) {
    if (!s.watching[sig].load()) continue;
    ::sigaction(sig, &s.earlier[sig], nullptr);
    s.watching[sig].store(false, std::memory_order_release);
  }
  internal::Installed& in = internal::TheInstalled();
  in.thread.reset();
  ::close(in.stop_fd);
  in.stop_fd = -1;
  s.installed.store(false);
}

bool PreemptionWatch::preempted() const { return internal::PreemptionSignal() != 0; }

int PreemptionWatch::signal() const { return internal::PreemptionSignal(); }

absl::Time PreemptionWatch::deadline() const {
  auto d = internal::PreemptionDeadline();
  if (!d.has_value()) return absl::InfiniteFuture();
  return absl::Now() + absl::FromChrono(*d - std::chrono::steady_clock::now());
}

absl::Duration PreemptionWatch::remaining() const {
  auto d = internal::PreemptionDeadline();
  if (!d.has_value()) return absl::InfiniteDuration();
  return std::max(absl::ZeroDuration(), absl::FromChrono(*d - std::chrono::steady_clock::now()));
}

bool PreemptionWatch::WaitFor(absl::Duration timeout) const {
  const absl::Time until = absl::Now() + timeout;
  while (!preempted()) {
    const absl::Duration left = until - absl::Now();
    if (left <= absl::ZeroDuration()) break;
    pollfd fd = {event_fd(), POLLIN, 0};
    ::poll(&fd, 1, static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1000)));
  }
  return preempted();
}

int PreemptionWatch::event_fd() const { return internal::TheInstalled().event_fd; }

}  // namespace ckpt
