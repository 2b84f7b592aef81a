// `ShardOutputs`: builds shard files whose record sizes are only known once
// encoded (compressed or delta records), through a small, fixed set of
// aligned output buffers that are written as they fill.
//
// Why it cannot deadlock: a shard holds at most one buffer, and only while
// bytes of it are still being produced. When a buffer is needed and none is
// free, `ShardOutputs` first waits for a write in flight (which gives its
// buffer back); when nothing is in flight, every buffer is held by some other
// shard's partial output, and one of them is *spilled*: its whole 4 KiB
// blocks are written, and the tail (under one block) is kept aside and
// copied to the front of that shard's next buffer. Each step either frees a
// buffer or starts a write that will, so any number of shards and any
// number of buffers (at least one) make progress.
#ifndef CKPT_ENGINE_SHARD_OUTPUTS_H_
#define CKPT_ENGINE_SHARD_OUTPUTS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ckpt/tensor.h"

#include "ckpt/kinds.h"

namespace ckpt::internal {

// Where a record ended up in its encoded shard.
struct RecordLayout {
  uint64_t offset = 0;
  uint64_t stored_bytes = 0;
  RecordEncoding encoding = RecordEncoding::kRaw;
  double error_bound = 0;
  std::optional<uint64_t> stored_xxh3;  // of the stored bytes (delta records)
};
struct ShardLayout {
  uint64_t file_bytes = 0;    // final size (end of the last record)
  uint64_t padded_bytes = 0;  // bytes written (a multiple of the alignment)
};

class ShardOutputs {
 public:
  // Starts writing `bytes` (a multiple of the alignment) of buffer `buffer`
  // to shard `shard` at `offset` (aligned). The buffer stays the writer's
  // until the write completes; the writer then calls `Release(buffer)`.
  using EmitFn = std::function<absl::Status(size_t shard, uint64_t offset, size_t buffer, size_t bytes)>;
  // Waits until at least one write started through `EmitFn` completes (and
  // was `Release`d). Returns false, at once, when no write is in flight.
  using WaitFn = std::function<absl::StatusOr<bool>()>;

  // REQUIRES: `buffers` >= 1; `buffer_bytes` a positive multiple of the
  // alignment.
  static absl::StatusOr<std::unique_ptr<ShardOutputs>> Create(size_t shards, size_t buffer_bytes,
                                                              size_t buffers, EmitFn emit,
                                                              WaitFn wait);

  // Pads shard `shard` to the alignment; returns the offset the next record
  // starts at.
  absl::StatusOr<uint64_t> BeginRecord(size_t shard);
  // Appends `n` bytes (`data`, or zeros when null) to shard `shard`.
  absl::Status Append(size_t shard, const char* data, size_t n);
  // Pads and emits what is left of shard `shard`; returns its layout. Later
  // calls for the same shard return the same layout and write nothing.
  absl::StatusOr<ShardLayout> FinishShard(size_t shard);
  bool finished(size_t shard) const { return state_[shard].finished; }

  // A write of `buffer` completed: it may be reused.
  void Release(size_t buffer) { free_.push_back(buffer); }

  char* buffer(size_t i) { return static_cast<char*>(memory_.data()) + i * buffer_bytes_; }
  size_t buffers() const { return buffers_; }
  // How often a partial buffer had to be written early to free it.
  uint64_t spills() const { return spills_; }

 private:
  struct State {
    uint64_t pos = 0;  // bytes of the shard produced
    size_t buffer = SIZE_MAX;
    size_t fill = 0;
    uint64_t buffer_offset = 0;  // shard offset of the buffer's first byte
    std::string tail;            // bytes of a spilled buffer past its last whole block
    bool finished = false;
    ShardLayout layout;
  };
  ShardOutputs(size_t shards, size_t buffer_bytes, size_t buffers, EmitFn emit, WaitFn wait);

  // Gives shard `shard` (which holds no buffer) a buffer, with its spilled
  // tail, if any, at the front.
  absl::Status TakeBuffer(size_t shard);
  // Writes the whole blocks of `victim`'s partial buffer and keeps the rest
  // aside, so the buffer can be reused.
  absl::Status Spill(size_t victim);

  const size_t buffer_bytes_;
  const size_t buffers_;
  const EmitFn emit_;
  const WaitFn wait_;
  AlignedBytes memory_;
  std::vector<State> state_;
  std::vector<size_t> free_;
  std::vector<size_t> holder_;  // buffer -> shard holding it, SIZE_MAX if none
  uint64_t spills_ = 0;
};

}  // namespace ckpt::internal

#endif  // CKPT_ENGINE_SHARD_OUTPUTS_H_
