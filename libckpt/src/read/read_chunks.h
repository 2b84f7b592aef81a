// `ReadChunks`: the aligned chunks a reader passes bytes through when they
// cannot go straight into place (targets the file's O_DIRECT alignment
// refuses, a record's final partial block, verification), which of them are
// free, and the workers that empty them: the thread driving the I/O only
// submits and reaps, while copies out of chunks and checksums of what landed
// run on `workers()`.
#ifndef CKPT_READ_READ_CHUNKS_H_
#define CKPT_READ_READ_CHUNKS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "ckpt/file_system.h"
#include "ckpt/options.h"
#include "io/chunk_pool.h"
#include "util/mutex.h"
#include "util/work_queue.h"

namespace ckpt::internal {

// Thread-safe where noted; otherwise one thread (the reader's) at a time.
class ReadChunks {
 public:
  // Sizes the pool for records of at most `largest_record` bytes, read
  // through `queue`; nothing is allocated until `Ensure`.
  ReadChunks(const IoOptions& io, uint64_t largest_record, IoQueue* queue)
      : chunk_bytes_(io.chunk_bytes),
        buffer_bytes_(io.buffer_bytes),
        queue_depth_(io.queue_depth),
        largest_record_(largest_record),
        queue_(queue) {}

  // Creates the pool on first call, every chunk free: one chunk per transfer
  // the queue holds (so reads into unaligned memory keep it full), no more
  // than `IoOptions::buffer_bytes` and than the checkpoint could use. Later
  // calls do nothing.
  absl::Status Ensure();
  bool created() const { return pool_.has_value(); }
  size_t count() const { return pool_.has_value() ? pool_->count() : 0; }

  // REQUIRES: `created()` for all below. Thread-safe.
  bool has_free() const {
    MutexLock lock(&mu_);
    return !free_.empty();
  }
  // REQUIRES: `has_free()`.
  size_t Take() {
    MutexLock lock(&mu_);
    const size_t chunk = free_.back();
    free_.pop_back();
    return chunk;
  }
  void Release(size_t chunk) {
    MutexLock lock(&mu_);
    free_.push_back(chunk);
  }
  char* chunk(size_t i) { return pool_->chunk(i); }
  int buf_index(size_t i) const { return pool_->buf_index(i); }

  // Marks every chunk free again, including those of abandoned transfers
  // (once their executor has drained and no worker holds one). Does nothing
  // before `Ensure`.
  void ReleaseAll();

  // The threads that copy out of chunks and check what landed (created on
  // first use: two, or one per core up to four).
  WorkQueue& workers();

 private:
  const uint64_t chunk_bytes_;
  const uint64_t buffer_bytes_;
  const uint64_t queue_depth_;
  const uint64_t largest_record_;
  IoQueue* const queue_;
  std::optional<ChunkPool> pool_;
  mutable Mutex mu_;
  std::vector<size_t> free_ ABSL_GUARDED_BY(mu_);  // chunk 0 at the back: taken first
  std::unique_ptr<WorkQueue> workers_;
};

}  // namespace ckpt::internal

#endif  // CKPT_READ_READ_CHUNKS_H_
