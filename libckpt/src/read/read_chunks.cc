#include "read/read_chunks.h"

#include <algorithm>
#include <utility>

#include "util/status_macros.h"
#include "ckpt/file_system.h"

namespace ckpt::internal {
namespace {

}  // namespace

absl::Status ReadChunks::Ensure() {
  if (pool_.has_value()) return absl::OkStatus();
  // No more than the checkpoint could use: small checkpoints open fast.
  // At most 8 chunks: aligned targets only pass record tails through them,
  // and pre-faulting more would cost the first read more than it saves.
  const uint64_t wanted = std::max<uint64_t>(
      2 * chunk_bytes_, std::min({buffer_bytes_, AlignUp(largest_record_, kDirectIoAlignment) * 2, 8 * chunk_bytes_}));
  CKPT_ASSIGN_OR_RETURN(ChunkPool pool, ChunkPool::Create(chunk_bytes_, wanted, queue_));
  pool_.emplace(std::move(pool));
  ReleaseAll();
  return absl::OkStatus();
}

void ReadChunks::ReleaseAll() {
  if (!pool_.has_value()) return;
  free_.clear();
  for (size_t i = pool_->count(); i > 0; --i) free_.push_back(i - 1);
}

}  // namespace ckpt::internal
