#include "engine/shard_outputs.h"

#include <algorithm>
#include <cstring>

#include "format/manifest.h"
#include "util/status_macros.h"

namespace ckpt::internal {
namespace {

uint64_t AlignUp(uint64_t n) { return (n + kRecordAlignment - 1) / kRecordAlignment * kRecordAlignment; }

}  // namespace

absl::StatusOr<std::unique_ptr<ShardOutputs>> ShardOutputs::Create(size_t shards,
                                                                   size_t buffer_bytes,
                                                                   size_t buffers) {
  auto out = std::make_unique<ShardOutputs>();
  out->buffer_bytes_ = buffer_bytes;
  out->buffers_ = buffers;
  out->state_.resize(shards);
  CKPT_ASSIGN_OR_RETURN(out->memory_, AlignedBytes::Allocate(buffer_bytes * buffers, true));
  return out;
}

absl::Status ShardOutputs::Append(size_t shard, const char* data, size_t n,
                                  const AcquireFn& acquire, const EmitFn& emit) {
  State& s = state_[shard];
  while (n > 0) {
    if (s.buffer == SIZE_MAX) {
      CKPT_ASSIGN_OR_RETURN(s.buffer, acquire());
      s.fill = 0;
      s.buffer_offset = s.pos;
    }
    const size_t take = std::min(n, buffer_bytes_ - s.fill);
    char* dst = buffer(s.buffer) + s.fill;
    if (data == nullptr) {
      std::memset(dst, 0, take);
    } else {
      std::memcpy(dst, data, take);
      data += take;
    }
    s.fill += take;
    s.pos += take;
    n -= take;
    if (s.fill == buffer_bytes_) {
      const size_t full = s.buffer;
      s.buffer = SIZE_MAX;
      CKPT_RETURN_IF_ERROR(emit(shard, s.buffer_offset, full, buffer_bytes_));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> ShardOutputs::BeginRecord(size_t shard, const AcquireFn& acquire,
                                                   const EmitFn& emit) {
  State& s = state_[shard];
  CKPT_RETURN_IF_ERROR(Append(shard, nullptr, AlignUp(s.pos) - s.pos, acquire, emit));
  return s.pos;
}

absl::StatusOr<ShardLayout> ShardOutputs::FinishShard(size_t shard, const AcquireFn& acquire,
                                                      const EmitFn& emit) {
  State& s = state_[shard];
  ShardLayout layout;
  layout.file_bytes = s.pos;
  CKPT_RETURN_IF_ERROR(Append(shard, nullptr, AlignUp(s.pos) - s.pos, acquire, emit));
  layout.padded_bytes = s.pos;
  if (s.buffer != SIZE_MAX) {
    const size_t last = s.buffer;
    s.buffer = SIZE_MAX;
    CKPT_RETURN_IF_ERROR(emit(shard, s.buffer_offset, last, s.fill));
  }
  return layout;
}

}  // namespace ckpt::internal
