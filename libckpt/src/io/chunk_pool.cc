#include "io/chunk_pool.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "util/log.h"

namespace ckpt::internal {

absl::StatusOr<ChunkPool> ChunkPool::Create(size_t chunk_bytes, size_t total_bytes,
                                            IoQueue* queue) {
  ChunkPool pool;
  pool.chunk_bytes_ = chunk_bytes;
  pool.count_ = std::max<size_t>(2, total_bytes / chunk_bytes);
  auto memory = AlignedBytes::Allocate(pool.count_ * chunk_bytes, /*prefault=*/true);
  if (!memory.ok()) return memory.status();
  pool.memory_ = std::move(*memory);
  if (queue != nullptr) {
    std::vector<std::span<char>> chunks(pool.count_);
    for (size_t i = 0; i < pool.count_; ++i) chunks[i] = {pool.chunk(i), chunk_bytes};
    absl::Status registered = queue->RegisterBuffers(chunks);
    pool.registered_ = registered.ok();
    if (!registered.ok() && registered.code() != absl::StatusCode::kUnimplemented) {
      Log(LogLevel::kDebug, absl::StrCat("buffers not registered: ", registered.message()));
    }
  }
  return pool;
}

}  // namespace ckpt::internal
