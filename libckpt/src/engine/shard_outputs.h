// `ShardOutputs`: builds shard files whose record sizes are only known once
// encoded (compressed or delta records), through a small set of aligned
// output buffers that are written as they fill.
#ifndef CKPT_ENGINE_SHARD_OUTPUTS_H_
#define CKPT_ENGINE_SHARD_OUTPUTS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "ckpt/tensor.h"

namespace ckpt::internal {

// Where a record ended up in its encoded shard.
struct RecordLayout {
  uint64_t offset = 0;
  uint64_t stored_bytes = 0;
  std::string encoding;  // "raw", "zstd", "sparse", "xor", "topk"
  double error_bound = 0;
};
struct ShardLayout {
  uint64_t file_bytes = 0;    // final size (end of the last record)
  uint64_t padded_bytes = 0;  // bytes written (a multiple of the alignment)
};

class ShardOutputs {
 public:
  // Hands a filled buffer to the writer: `bytes` of buffer `buffer` go to
  // shard `shard` at `offset` (aligned; `bytes` is a multiple of the
  // alignment).
  using EmitFn = std::function<absl::Status(size_t shard, uint64_t offset, size_t buffer, size_t bytes)>;
  // Returns a free buffer index, waiting for a write to complete if needed.
  using AcquireFn = std::function<absl::StatusOr<size_t>()>;

  static absl::StatusOr<std::unique_ptr<ShardOutputs>> Create(size_t shards, size_t buffer_bytes,
                                                              size_t buffers);

  // Pads shard `shard` to the alignment; returns the offset the next record
  // starts at.
  absl::StatusOr<uint64_t> BeginRecord(size_t shard, const AcquireFn& acquire, const EmitFn& emit);
  // Appends `n` bytes (`data`, or zeros when null) to shard `shard`.
  absl::Status Append(size_t shard, const char* data, size_t n, const AcquireFn& acquire,
                      const EmitFn& emit);
  // Pads and emits what is left of shard `shard`; returns its layout.
  absl::StatusOr<ShardLayout> FinishShard(size_t shard, const AcquireFn& acquire, const EmitFn& emit);

  char* buffer(size_t i) { return static_cast<char*>(memory_.data()) + i * buffer_bytes_; }
  size_t buffers() const { return buffers_; }

 private:
  struct State {
    uint64_t pos = 0;  // bytes of the shard produced
    size_t buffer = SIZE_MAX;
    size_t fill = 0;
    uint64_t buffer_offset = 0;
  };
  size_t buffer_bytes_ = 0;
  size_t buffers_ = 0;
  AlignedBytes memory_;
  std::vector<State> state_;
};

}  // namespace ckpt::internal

#endif  // CKPT_ENGINE_SHARD_OUTPUTS_H_
