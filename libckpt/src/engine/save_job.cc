#include "engine/save_job.h"

namespace ckpt::internal {

absl::Status SaveJob::WaitStaged() {
  MutexLock lock(&mu_);
  mu_.Await([this] { return staging_done_; });
  if (!staging_status_.ok()) error_reported_ = true;
  return staging_status_;
}

absl::Status SaveJob::Wait() {
  MutexLock lock(&mu_);
  mu_.Await([this] { return done_; });
  error_reported_ = true;
  return status_;
}

bool SaveJob::Done() const {
  MutexLock lock(&mu_);
  return done_;
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

void SaveJob::FinishStaging(absl::Status status) {
  Touch();
  MutexLock lock(&mu_);
  staging_done_ = true;
  staging_status_ = std::move(status);
}

absl::Status SaveJob::staging_status() const {
  MutexLock lock(&mu_);
  return staging_status_;
}

bool SaveJob::TakeChunks(bool block, std::vector<StagedChunk>* out) {
  MutexLock lock(&mu_);
  if (block) {
    mu_.Await([this] { return staging_done_ || (!ready_.empty() && WritesAllowed()); });
  }
  if (!WritesAllowed()) return true;
  out->insert(out->end(), ready_.begin(), ready_.end());
  ready_.clear();
  return !(staging_done_ && out->empty());
}

void SaveJob::Finish(absl::Status status, SaveStats stats) {
  MutexLock lock(&mu_);
  if (!staging_done_) {
    staging_done_ = true;
    staging_status_ = status;
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
  return error_reported_ || status_.ok();
}

}  // namespace ckpt::internal
