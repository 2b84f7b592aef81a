// The engine's watchdog thread: warns once about a save that made no
// progress for `watchdog_timeout` (and calls `on_stall`), gives a save up
// after `stall_timeout`, and abandons every save not durable by a
// preemption deadline (ckpt/preemption.h).
#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "engine/engine_impl.h"
#include "preemption/preemption_state.h"
#include "util/log.h"

namespace ckpt::internal {

// Watches the oldest save not given up yet: warns once after
// `watchdog_timeout` without progress, gives it up after `stall_timeout`.
// Past a preemption deadline, gives up every save in flight.
void EngineImpl::Watch() {
  const absl::Duration warn_after = options_.watchdog_timeout;
  const absl::Duration give_up_after = options_.stall_timeout;
  absl::Duration shortest = absl::InfiniteDuration();
  if (warn_after > absl::ZeroDuration()) shortest = warn_after;
  if (give_up_after > absl::ZeroDuration()) shortest = std::min(shortest, give_up_after);
  // (At most 200 ms: a preemption is noticed that soon.)
  const absl::Duration period =
      std::clamp(shortest / 4, absl::Milliseconds(10), absl::Milliseconds(200));
  MutexLock lock(&mu_);
  while (!watchdog_stop_) {
    absl::Duration wait = period;
    const auto deadline = PreemptionDeadline();
    if (deadline.has_value() && Clock::now() < *deadline) {
      wait = std::min(period, absl::FromChrono(*deadline - Clock::now()));
    }
    mu_.AwaitWithTimeout([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return watchdog_stop_; }, wait);
    if (watchdog_stop_) continue;
    if (PreemptionDeadlinePassed()) {
      AbandonAtDeadline();
      continue;
    }
    auto live = std::find_if(inflight_.begin(), inflight_.end(),
                             [](const auto& j) { return !j->expired(); });
    if (live == inflight_.end()) continue;
    std::shared_ptr<SaveJob> job = *live;
    const absl::Duration idle = absl::FromChrono(job->since_progress());
    const char* stage = SaveStageName(job->stage.load());
    if (give_up_after > absl::ZeroDuration() && idle >= give_up_after) {
      absl::Status error = absl::DeadlineExceededError(absl::StrCat(
          "save of step ", job->step(), " in ", root_, " made no progress for ",
          absl::FormatDuration(idle), " while in stage ", stage,
          " (stall_timeout); given up, nothing committed"));
      if (GiveUp(job, std::move(error))) continue;
    }
    if (warn_after <= absl::ZeroDuration() || idle < warn_after ||
        job->stall_reported.exchange(true)) {
      continue;
    }
    ++stats_.watchdog_stalls;
    Log(LogLevel::kWarning, absl::StrCat("watchdog: save of step ", job->step(), " in ", root_,
                                         " made no progress for ", absl::FormatDuration(idle),
                                         " (stage: ", stage, ")"));
    if (options_.on_stall) {
      mu_.Unlock();
      options_.on_stall(job->step(), idle);
      mu_.Lock();
    }
  }
}

void EngineImpl::AbandonAtDeadline() {
  for (const std::shared_ptr<SaveJob>& job : inflight_) {
    GiveUp(job, absl::DeadlineExceededError(absl::StrCat(
        "save of step ", job->step(), " in ", root_, " abandoned: not durable when ", PreemptionGraceRanOut(),
        "; nothing committed, the previous checkpoint stays the latest")));
  }
}

bool EngineImpl::GiveUp(const std::shared_ptr<SaveJob>& job, absl::Status error) {
  if (!job->Expire(error)) return false;  // done, committing (it finishes), or given up already
  ++stats_.saves_given_up;
  // Logged now, not when the persister is done with it: a hung disk may
  // never let it finish.
  Log(LogLevel::kError, error.message());
  failed_.emplace_back(job, std::move(error));
  pool_.WakeWaiters();  // a stager waiting for staging memory stops
  return true;
}

}  // namespace ckpt::internal
