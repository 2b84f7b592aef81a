#include "testing/fault_injection_state.h"

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "util/errno_status.h"

namespace ckpt::testing {

Fault FaultInjectionFileSystem::State::OnCall(bool transfer,
                                              absl::FunctionRef<std::string()> describe) {
  internal::MutexLock lock(&mu_);
  ++count_;
  if (record_) recorded_.push_back(describe());
  Fault fault = Fault::kNone;
  if (crashed_) {
    fault = Fault::kCrash;
  } else if (count_ == fail_at_ && fault_ != Fault::kNone) {
    fault = fault_;
    if (!transfer && (fault == Fault::kShortTransfer || fault == Fault::kEintr)) {
      fault = Fault::kNone;
    }
    if (fault == Fault::kCrash) crashed_ = true;
  }
  if (fault != Fault::kNone) {
    if (injected_++ == 0) {
      first_injected_ = absl::StrCat(describe(), " [", std::string(FaultName(fault)), "]");
    }
  }
  return fault;
}

void FaultInjectionFileSystem::State::BeforeTransfers(size_t ops) {
  absl::Duration delay;
  {
    internal::MutexLock lock(&mu_);
    if (io_held_) {
      ++io_held_waiters_;
      mu_.Await([this] { return !io_held_; });
      --io_held_waiters_;
    }
    delay = io_delay_;
  }
  if (delay > absl::ZeroDuration()) absl::SleepFor(delay * static_cast<int64_t>(ops));
}

namespace fault_internal {

absl::Status FaultStatus(Fault fault, const std::string& what) {
  switch (fault) {
    case Fault::kEio:
      return ckpt::internal::ErrnoToStatus(EIO, absl::StrCat("injected fault: ", what));
    case Fault::kEnospc:
      return ckpt::internal::ErrnoToStatus(ENOSPC, absl::StrCat("injected fault: ", what));
    case Fault::kCrash: return absl::AbortedError(absl::StrCat("simulated crash: ", what));
    default: return absl::OkStatus();
  }
}

absl::Status Check(State& state, const std::string& what) {
  return FaultStatus(state.OnCall(/*transfer=*/false, [&] { return what; }), what);
}

size_t ShortLength(size_t length, bool direct) {
  if (direct) {
    if (length < 2 * kDirectIoAlignment) return 0;
    return (length / 2) / kDirectIoAlignment * kDirectIoAlignment;
  }
  return length >= 2 ? length / 2 : 0;
}

}  // namespace fault_internal
}  // namespace ckpt::testing
