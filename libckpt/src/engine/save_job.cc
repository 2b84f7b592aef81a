#include "engine/save_job.h"

namespace ckpt::internal {

const char* SaveStageName(SaveStage stage) {
  switch (stage) {
    case SaveStage::kQueued: return "queued behind an earlier save";
    case SaveStage::kStaging: return "staging";
    case SaveStage::kEncoding: return "encoding";
    case SaveStage::kWriting: return "writing";
    case SaveStage::kCommitting: return "commit";
  }
  return "unknown";
}

absl::Status SaveJob::WaitStaged() {
  MutexLock lock(&mu_);
  mu_.Await([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return staging_done_ || expired_; });
  const absl::Status s = staging_done_ ? staging_.status : abort_reason_;
  if (!s.ok()) error_reported_ = true;
  return s;
}

absl::Status SaveJob::Wait() {
  MutexLock lock(&mu_);
  mu_.Await([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_ || expired_; });
  error_reported_ = true;
  return done_ ? status_ : abort_reason_;
}

bool SaveJob::Done() const {
  MutexLock lock(&mu_);
  return done_ || expired_;
}

void SaveJob::Abort(absl::Status reason) {
  MutexLock lock(&mu_);  // unlocking wakes a persister waiting for chunks
  if (abort_reason_.ok()) abort_reason_ = std::move(reason);
  abort = true;
}

absl::Status SaveJob::abort_reason() const {
  MutexLock lock(&mu_);
  return abort_reason_;
}

bool SaveJob::BeginCommit() {
  MutexLock lock(&mu_);
  if (abort) return false;
  committing_ = true;
  return true;
}

bool SaveJob::Expire(absl::Status reason) {
  MutexLock lock(&mu_);
  if (done_ || committing_ || expired_) return false;
  if (abort_reason_.ok()) abort_reason_ = std::move(reason);
  abort = true;
  expired_ = true;
  return true;
}

bool SaveJob::expired() const {
  MutexLock lock(&mu_);
  return expired_;
}

bool SaveJob::skipped() const {
  MutexLock lock(&mu_);
  return skipped_;
}

SaveStats SaveJob::stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

void SaveJob::PushChunk(const StagedChunk& chunk) {
  // The persister is woken once per batch of chunks, not per chunk: on a
  // small machine a wakeup per MiB costs the copying thread more than the
  // first write gains by starting a few chunks earlier. While writes are in
  // flight the persister picks chunks up without being woken.
  constexpr size_t kWakeBatch = 8;
  Touch();
  mu_.Lock();
  ready_.push_back(chunk);
  if (ready_.size() >= kWakeBatch && WritesAllowed()) {
    mu_.Unlock();
  } else {
    mu_.UnlockQuietly();
  }
}

void SaveJob::WakePersister() {
  MutexLock lock(&mu_);  // unlocking wakes every waiter
  writes_released_ = true;
}

void SaveJob::FinishStaging(StagingReport report) {
  Touch();
  MutexLock lock(&mu_);
  staging_done_ = true;
  staging_ = std::move(report);
}

absl::Status SaveJob::staging_status() const {
  MutexLock lock(&mu_);
  return staging_.status;
}

StagingReport SaveJob::staging_report() const {
  MutexLock lock(&mu_);
  return staging_;
}

bool SaveJob::TakeChunks(bool block, bool stop_on_abort, std::vector<StagedChunk>* out) {
  MutexLock lock(&mu_);
  // An aborted save's chunks are only given back: deferral no longer applies.
  const auto takeable = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !ready_.empty() && (WritesAllowed() || abort);
  };
  if (block) {
    mu_.Await([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return staging_done_ || (stop_on_abort && abort) || takeable();
    });
  }
  if (!WritesAllowed() && !abort) return true;
  out->insert(out->end(), ready_.begin(), ready_.end());
  ready_.clear();
  return !(staging_done_ && out->empty());
}

void SaveJob::Finish(absl::Status status, SaveStats stats) {
  MutexLock lock(&mu_);
  // What an expired save's waiters were told stays its outcome.
  if (expired_) status = abort_reason_;
  if (!staging_done_) {
    staging_done_ = true;
    staging_.status = status;
  }
  status_ = std::move(status);
  stats_ = std::move(stats);
  done_ = true;
}

void SaveJob::MarkSkipped(SaveStats stats) {
  MutexLock lock(&mu_);
  staging_done_ = true;
  skipped_ = true;
  stats_ = std::move(stats);
  stats_.skipped = true;
  done_ = true;
  error_reported_ = true;
}

void SaveJob::MarkErrorReported() {
  MutexLock lock(&mu_);
  error_reported_ = true;
}

bool SaveJob::error_reported() const {
  MutexLock lock(&mu_);
  if (error_reported_ || expired_) return error_reported_;
  return status_.ok();
}

}  // namespace ckpt::internal
