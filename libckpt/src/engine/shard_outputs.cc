#include "engine/shard_outputs.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "format/manifest.h"
#include "util/status_macros.h"
#include "ckpt/file_system.h"

namespace ckpt::internal {

ShardOutputs::ShardOutputs(size_t shards, size_t buffer_bytes, size_t buffers, EmitFn emit,
                           WaitFn wait)
    : buffer_bytes_(buffer_bytes),
      buffers_(buffers),
      emit_(std::move(emit)),
      wait_(std::move(wait)),
      state_(shards),
      holder_(buffers, SIZE_MAX) {
  for (size_t i = buffers; i > 0; --i) free_.push_back(i - 1);
}

absl::StatusOr<std::unique_ptr<ShardOutputs>> ShardOutputs::Create(size_t shards,
                                                                   size_t buffer_bytes,
                                                                   size_t buffers, EmitFn emit,
                                                                   WaitFn wait) {
  if (buffers == 0 || buffer_bytes == 0 || buffer_bytes % kRecordAlignment != 0) {
    return absl::InvalidArgumentError(absl::StrCat("encoder output buffers: ", buffers, " x ",
                                                   buffer_bytes, " bytes"));
  }
  std::unique_ptr<ShardOutputs> out(
      new ShardOutputs(shards, buffer_bytes, buffers, std::move(emit), std::move(wait)));
  CKPT_ASSIGN_OR_RETURN(out->memory_, AlignedBytes::Allocate(buffer_bytes * buffers, true));
  return out;
}

absl::Status ShardOutputs::TakeBuffer(size_t shard) {
  while (free_.empty()) {
    CKPT_ASSIGN_OR_RETURN(bool waited, wait_());
    if (waited) continue;
    // Nothing in flight, nothing free: every buffer is another shard's
    // partial output (this shard holds none). Spill the fullest.
    size_t victim = SIZE_MAX;
    for (size_t b = 0; b < buffers_; ++b) {
      const size_t s = holder_[b];
      if (s != SIZE_MAX && (victim == SIZE_MAX || state_[s].fill > state_[victim].fill)) victim = s;
    }
    if (victim == SIZE_MAX) return absl::InternalError("encoder output buffers lost track");
    CKPT_RETURN_IF_ERROR(Spill(victim));
  }
  State& s = state_[shard];
  s.buffer = free_.back();
  free_.pop_back();
  holder_[s.buffer] = shard;
  s.fill = s.tail.size();
  s.buffer_offset = s.pos - s.fill;
  if (!s.tail.empty()) {
    std::memcpy(buffer(s.buffer), s.tail.data(), s.tail.size());
    s.tail.clear();
  }
  return absl::OkStatus();
}

absl::Status ShardOutputs::Spill(size_t victim) {
  State& s = state_[victim];
  const size_t whole = s.fill / kRecordAlignment * kRecordAlignment;
  const size_t b = s.buffer;
  s.tail.assign(buffer(b) + whole, s.fill - whole);
  s.buffer = SIZE_MAX;
  s.fill = 0;
  holder_[b] = SIZE_MAX;
  ++spills_;
  if (whole == 0) {
    free_.push_back(b);
    return absl::OkStatus();
  }
  return emit_(victim, s.buffer_offset, b, whole);
}

absl::Status ShardOutputs::Append(size_t shard, const char* data, size_t n) {
  State& s = state_[shard];
  if (s.finished) return absl::InternalError(absl::StrCat("shard #", shard, " appended to after it was finished"));
  while (n > 0) {
    if (s.buffer == SIZE_MAX) CKPT_RETURN_IF_ERROR(TakeBuffer(shard));
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
      holder_[full] = SIZE_MAX;
      CKPT_RETURN_IF_ERROR(emit_(shard, s.buffer_offset, full, buffer_bytes_));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> ShardOutputs::BeginRecord(size_t shard) {
  State& s = state_[shard];
  CKPT_RETURN_IF_ERROR(Append(shard, nullptr, AlignUp(s.pos, kRecordAlignment) - s.pos));
  return s.pos;
}

absl::StatusOr<ShardLayout> ShardOutputs::FinishShard(size_t shard) {
  State& s = state_[shard];
  if (s.finished) return s.layout;
  const uint64_t file_bytes = s.pos;
  // A spilled tail means `pos` is not aligned: the padding takes a buffer,
  // which takes the tail in.
  CKPT_RETURN_IF_ERROR(Append(shard, nullptr, AlignUp(s.pos, kRecordAlignment) - s.pos));
  s.finished = true;
  s.layout = ShardLayout{file_bytes, s.pos};
  if (s.buffer != SIZE_MAX) {
    const size_t last = s.buffer;
    s.buffer = SIZE_MAX;
    holder_[last] = SIZE_MAX;
    if (s.fill == 0) {
      free_.push_back(last);
    } else {
      CKPT_RETURN_IF_ERROR(emit_(shard, s.buffer_offset, last, s.fill));
    }
  }
  return s.layout;
}

}  // namespace ckpt::internal
