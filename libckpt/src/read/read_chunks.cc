#include "read/read_chunks.h"

#include <algorithm>
#include <utility>

#include "util/status_macros.h"
#include "util/worker_pool.h"
#include "ckpt/file_system.h"

namespace ckpt::internal {

absl::Status ReadChunks::Ensure() {
  if (pool_.has_value()) return absl::OkStatus();
  // One chunk per transfer in flight: a read into memory O_DIRECT cannot
  // fill in place keeps the queue as full as an aligned one. No more than
  // the checkpoint could use (small checkpoints open fast) nor than
  // `buffer_bytes` allows.
  const uint64_t wanted = std::max<uint64_t>(
      2 * chunk_bytes_, std::min({buffer_bytes_, AlignUp(largest_record_, kDirectIoAlignment) * 2,
                                  std::max<uint64_t>(queue_depth_, 2) * chunk_bytes_}));
  CKPT_ASSIGN_OR_RETURN(ChunkPool pool, ChunkPool::Create(chunk_bytes_, wanted, queue_));
  pool_.emplace(std::move(pool));
  ReleaseAll();
  return absl::OkStatus();
}

void ReadChunks::ReleaseAll() {
  if (!pool_.has_value()) return;
  MutexLock lock(&mu_);
  free_.clear();
  for (size_t i = pool_->count(); i > 0; --i) free_.push_back(i - 1);
}

WorkQueue& ReadChunks::workers() {
  if (workers_ == nullptr) {
    workers_ = std::make_unique<WorkQueue>(std::clamp(WorkerPool::DefaultThreads(0), 2, 4), "ckpt-land");
  }
  return *workers_;
}

}  // namespace ckpt::internal
