// `ChunkPool`: one pre-faulted, 4 KiB-aligned allocation cut into equal
// chunks that bytes pass through on their way to or from disk. Allocated
// once per engine or reader and reused by every save or read.
#ifndef CKPT_IO_CHUNK_POOL_H_
#define CKPT_IO_CHUNK_POOL_H_

#include <cstddef>
#include <vector>

#include "absl/status/statusor.h"
#include "ckpt/file_system.h"
#include "ckpt/tensor.h"

namespace ckpt::internal {

class ChunkPool {
 public:
  // `total_bytes` / `chunk_bytes` chunks (at least 2). Registers them with
  // `queue` when it supports registered buffers (then `buf_index(i) == i`).
  static absl::StatusOr<ChunkPool> Create(size_t chunk_bytes, size_t total_bytes, IoQueue* queue);

  size_t chunk_bytes() const { return chunk_bytes_; }
  size_t count() const { return count_; }
  char* chunk(size_t i) { return static_cast<char*>(memory_.data()) + i * chunk_bytes_; }
  int buf_index(size_t i) const { return registered_ ? static_cast<int>(i) : -1; }

 private:
  AlignedBytes memory_;
  size_t chunk_bytes_ = 0;
  size_t count_ = 0;
  bool registered_ = false;
};

}  // namespace ckpt::internal

#endif  // CKPT_IO_CHUNK_POOL_H_
