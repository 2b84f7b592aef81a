// What a finished save leaves in the engine: its bookkeeping and figures
// (`stats`, the metrics files), and a failure no handle reported yet, which
// the next `SaveAsync` or `Close` returns.
#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "engine/engine_impl.h"
#include "engine/metrics.h"
#include "preemption/preemption_state.h"
#include "util/log.h"

namespace ckpt::internal {

void EngineImpl::OnSaveDone(SaveJob& job, const absl::Status& outcome, const SaveStats& s) {
  EngineStats snapshot;
  std::vector<SaveStats> skipped;
  {
    MutexLock lock(&mu_);
    skipped.swap(skipped_unlogged_);
    auto it = std::find_if(inflight_.begin(), inflight_.end(),
                           [&](const auto& j) { return j.get() == &job; });
    std::shared_ptr<SaveJob> owned;
    if (it != inflight_.end()) {
      owned = *it;
      inflight_.erase(it);
      AddProcessSavesInFlight(-1);
    }
    steps_in_flight_.erase(job.step());
    if (outcome.ok()) {
      ++stats_.saves_committed;
      stats_.bytes_committed += s.file_bytes;
    } else {
      ++stats_.saves_failed;
      // A save the watchdog gave up was queued for reporting then.
      if (owned != nullptr && !job.expired()) failed_.emplace_back(owned, outcome);
    }
    stats_.last = s;
    snapshot = stats_;
    snapshot.saves_in_flight = inflight_.size();
  }
  snapshot.staging_bytes = pool_.count() * pool_.chunk_bytes();
  // (A save the watchdog gave up was logged then.)
  if (!outcome.ok() && !job.expired()) Log(LogLevel::kError, outcome.message());
  if (tier_ != nullptr) {
    if (outcome.ok()) {
      tier_->Submit(job.step());
    } else {
      tier_->Skip(job.step(), outcome);
    }
  }
  AppendMetricsLine(s, outcome);
  LogSkipped(skipped);
  if (metrics_.has_prometheus()) {
    absl::Status m = metrics_.WritePrometheus(PrometheusText(snapshot, root_));
    if (!m.ok()) Log(LogLevel::kWarning, absl::StrCat("prometheus textfile: ", m.message()));
  }
}

void EngineImpl::AppendMetricsLine(const SaveStats& s, const absl::Status& outcome) {
  if (!metrics_.has_jsonl()) return;
  absl::Status m = metrics_.AppendJsonLine(SaveMetricsLine(s, outcome));
  if (!m.ok()) Log(LogLevel::kWarning, absl::StrCat("metrics log: ", m.message()));
}

void EngineImpl::LogSkipped(const std::vector<SaveStats>& skipped) {
  for (const SaveStats& s : skipped) AppendMetricsLine(s, absl::OkStatus());
}

absl::Status EngineImpl::TakeUnreportedError() {
  MutexLock lock(&mu_);
  while (!failed_.empty()) {
    auto [job, error] = std::move(failed_.front());
    failed_.pop_front();
    if (job->Done() && job->error_reported()) continue;
    job->MarkErrorReported();
    return absl::Status(error.code(), absl::StrCat("an earlier save failed: ", error.message()));
  }
  return absl::OkStatus();
}

EngineStats EngineImpl::stats() const {
  MutexLock lock(&mu_);
  EngineStats s = stats_;
  s.saves_in_flight = inflight_.size();
  s.staging_bytes = pool_.count() * pool_.chunk_bytes();
  s.staging_bytes_free = pool_.free_count() * pool_.chunk_bytes();
  s.staging_memory = PinKindName(pool_.pin_kind());
  s.backend = backend_.description;
  return s;
}

}  // namespace ckpt::internal
