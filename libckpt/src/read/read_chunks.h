// `ReadChunks`: the aligned chunks a reader passes bytes through when they
// cannot go straight into place (unaligned targets, a record's final partial
// block under O_DIRECT, verification), and which of them are free.
#ifndef CKPT_READ_READ_CHUNKS_H_
#define CKPT_READ_READ_CHUNKS_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "ckpt/file_system.h"
#include "ckpt/options.h"
#include "io/chunk_pool.h"

namespace ckpt::internal {

class ReadChunks {
 public:
  // Sizes the pool for records of at most `largest_record` bytes, read
  // through `queue`; nothing is allocated until `Ensure`.
  ReadChunks(const IoOptions& io, uint64_t largest_record, IoQueue* queue)
      : chunk_bytes_(io.chunk_bytes),
        buffer_bytes_(io.buffer_bytes),
        largest_record_(largest_record),
        queue_(queue) {}

  // Creates the pool on first call, every chunk free. Later calls do nothing.
  absl::Status Ensure();
  bool created() const { return pool_.has_value(); }

  // REQUIRES: `created()` for all below.
  bool has_free() const { return !free_.empty(); }
  // REQUIRES: `has_free()`.
  size_t Take() {
    const size_t chunk = free_.back();
    free_.pop_back();
    return chunk;
  }
  void Release(size_t chunk) { free_.push_back(chunk); }
  char* chunk(size_t i) { return pool_->chunk(i); }
  int buf_index(size_t i) const { return pool_->buf_index(i); }

  // Marks every chunk free again, including those of abandoned transfers
  // (once their executor has drained). Does nothing before `Ensure`.
  void ReleaseAll();

 private:
  const uint64_t chunk_bytes_;
  const uint64_t buffer_bytes_;
  const uint64_t largest_record_;
  IoQueue* const queue_;
  std::optional<ChunkPool> pool_;
  std::vector<size_t> free_;  // chunk 0 at the back: taken first
};

}  // namespace ckpt::internal

#endif  // CKPT_READ_READ_CHUNKS_H_
