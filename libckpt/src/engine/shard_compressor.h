// `ShardCompressor`: turns a save's raw staged chunks into zstd-compressed
// shard files, on the persister thread.
#ifndef CKPT_ENGINE_SHARD_COMPRESSOR_H_
#define CKPT_ENGINE_SHARD_COMPRESSOR_H_

#include <zstd.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "ckpt/tensor.h"
#include "engine/save_job.h"

namespace ckpt::internal {

// Where each record of a shard ended up, and how big the file is.
struct ShardLayout {
  uint64_t file_bytes = 0;    // final size (end of the last record)
  uint64_t padded_bytes = 0;  // bytes written (a multiple of the alignment)
};
struct RecordLayout {
  uint64_t offset = 0;
  uint64_t stored_bytes = 0;
  bool compressed = false;
};

// Each record becomes a sequence of independent zstd frames, one per part of
// it that one staged chunk held (so a reader can stream them), starting at an
// aligned offset of the compressed shard. Output goes through `out_chunks`
// aligned buffers of `out_chunk_bytes`, each handed to `emit` once full (or
// at the end of a shard); `acquire` must return a free buffer index, waiting
// for a written one if needed, and `release` is called by the owner when a
// write of buffer i completes.
class ShardCompressor {
 public:
  using EmitFn = std::function<absl::Status(size_t shard, uint64_t offset, size_t buffer, size_t bytes)>;
  using AcquireFn = std::function<absl::StatusOr<size_t>()>;

  ShardCompressor(const SaveJob& job, int level, size_t out_chunk_bytes, size_t out_chunks);
  ~ShardCompressor();

  static absl::StatusOr<std::unique_ptr<ShardCompressor>> Create(const SaveJob& job, int level,
                                                                 size_t out_chunk_bytes,
                                                                 size_t out_chunks);

  // Compresses the record bytes of `chunk` (raw layout), whose bytes are at
  // `data`. REQUIRES: chunks of a shard arrive in file-offset order.
  absl::Status Consume(const StagedChunk& chunk, const char* data, const AcquireFn& acquire,
                       const EmitFn& emit);
  // Flushes every shard. Call once, after the last chunk.
  absl::Status Finish(const AcquireFn& acquire, const EmitFn& emit);

  char* buffer(size_t i) { return static_cast<char*>(out_.data()) + i * out_chunk_bytes_; }
  size_t buffers() const { return out_chunks_; }
  const std::vector<ShardLayout>& shards() const { return shards_; }
  const std::vector<RecordLayout>& records() const { return records_; }  // by tensor index

 private:
  struct ShardState {
    size_t next_record = 0;  // index into plan.records of the first not yet started
    uint64_t out_pos = 0;    // bytes of compressed stream produced
    size_t buffer = SIZE_MAX;
    size_t fill = 0;
    uint64_t buffer_offset = 0;  // file offset of `buffer`'s first byte
  };

  absl::Status Append(size_t shard, const char* data, size_t n, bool zeros,
                      const AcquireFn& acquire, const EmitFn& emit);
  absl::Status StartRecord(size_t shard, size_t record, const AcquireFn& acquire, const EmitFn& emit);

  const SaveJob& job_;
  const int level_;
  const size_t out_chunk_bytes_;
  const size_t out_chunks_;
  AlignedBytes out_;
  std::vector<char> scratch_;
  ZSTD_CCtx* cctx_ = nullptr;
  std::vector<ShardState> state_;
  std::vector<ShardLayout> shards_;
  std::vector<RecordLayout> records_;
};

}  // namespace ckpt::internal

#endif  // CKPT_ENGINE_SHARD_COMPRESSOR_H_
