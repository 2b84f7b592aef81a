#include "engine/shard_compressor.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "format/manifest.h"
#include "util/status_macros.h"

namespace ckpt::internal {
namespace {

uint64_t AlignUp(uint64_t n) { return (n + kRecordAlignment - 1) / kRecordAlignment * kRecordAlignment; }

}  // namespace

ShardCompressor::ShardCompressor(const SaveJob& job, int level, size_t out_chunk_bytes,
                                 size_t out_chunks)
    : job_(job),
      level_(level),
      out_chunk_bytes_(out_chunk_bytes),
      out_chunks_(out_chunks),
      state_(job.plan.size()),
      shards_(job.plan.size()),
      records_(job.tensors.size()) {}

ShardCompressor::~ShardCompressor() {
  if (cctx_ != nullptr) ZSTD_freeCCtx(cctx_);
}

absl::StatusOr<std::unique_ptr<ShardCompressor>> ShardCompressor::Create(const SaveJob& job,
                                                                         int level,
                                                                         size_t out_chunk_bytes,
                                                                         size_t out_chunks) {
  auto c = std::make_unique<ShardCompressor>(job, level, out_chunk_bytes, out_chunks);
  CKPT_ASSIGN_OR_RETURN(c->out_, AlignedBytes::Allocate(out_chunk_bytes * out_chunks, true));
  c->cctx_ = ZSTD_createCCtx();
  if (c->cctx_ == nullptr) return absl::ResourceExhaustedError("ZSTD_createCCtx failed");
  ZSTD_CCtx_setParameter(c->cctx_, ZSTD_c_compressionLevel, level);
  ZSTD_CCtx_setParameter(c->cctx_, ZSTD_c_checksumFlag, 0);  // XXH3 of the raw bytes covers it
  return c;
}

absl::Status ShardCompressor::Append(size_t shard, const char* data, size_t n, bool zeros,
                                     const AcquireFn& acquire, const EmitFn& emit) {
  ShardState& s = state_[shard];
  while (n > 0) {
    if (s.buffer == SIZE_MAX) {
      CKPT_ASSIGN_OR_RETURN(s.buffer, acquire());
      s.fill = 0;
      s.buffer_offset = s.out_pos;
    }
    const size_t take = std::min(n, out_chunk_bytes_ - s.fill);
    char* dst = buffer(s.buffer) + s.fill;
    if (zeros) std::memset(dst, 0, take);
    else std::memcpy(dst, data, take), data += take;
    s.fill += take;
    s.out_pos += take;
    n -= take;
    if (s.fill == out_chunk_bytes_) {
      const size_t full = s.buffer;
      s.buffer = SIZE_MAX;
      CKPT_RETURN_IF_ERROR(emit(shard, s.buffer_offset, full, out_chunk_bytes_));
    }
  }
  return absl::OkStatus();
}

absl::Status ShardCompressor::StartRecord(size_t shard, size_t record, const AcquireFn& acquire,
                                          const EmitFn& emit) {
  ShardState& s = state_[shard];
  const size_t tensor = job_.plan[shard].records[record].tensor;
  CKPT_RETURN_IF_ERROR(Append(shard, nullptr, AlignUp(s.out_pos) - s.out_pos, true, acquire, emit));
  records_[tensor] = RecordLayout{s.out_pos, 0, true};
  return absl::OkStatus();
}

absl::Status ShardCompressor::Consume(const StagedChunk& chunk, const char* data,
                                      const AcquireFn& acquire, const EmitFn& emit) {
  const PlannedShard& plan = job_.plan[chunk.shard];
  ShardState& s = state_[chunk.shard];
  const uint64_t begin = chunk.file_offset;
  const uint64_t end = begin + chunk.bytes;
  for (size_t r = s.next_record == 0 ? 0 : s.next_record - 1; r < plan.records.size(); ++r) {
    const PlannedRecord& rec = plan.records[r];
    if (rec.offset >= end) break;
    const uint64_t lo = std::max<uint64_t>(begin, rec.offset);
    const uint64_t hi = std::min<uint64_t>(end, rec.offset + rec.bytes);
    if (r >= s.next_record) {
      // `r` starts in this chunk (zero-byte records included).
      CKPT_RETURN_IF_ERROR(StartRecord(chunk.shard, r, acquire, emit));
      s.next_record = r + 1;
    }
    if (lo >= hi) continue;
    const size_t n = hi - lo;
    scratch_.resize(ZSTD_compressBound(n));
    const size_t z = ZSTD_compress2(cctx_, scratch_.data(), scratch_.size(), data + (lo - begin), n);
    if (ZSTD_isError(z)) {
      return absl::InternalError(absl::StrCat("zstd: ", ZSTD_getErrorName(z)));
    }
    CKPT_RETURN_IF_ERROR(Append(chunk.shard, scratch_.data(), z, false, acquire, emit));
    records_[rec.tensor].stored_bytes += z;
  }
  return absl::OkStatus();
}

absl::Status ShardCompressor::Finish(const AcquireFn& acquire, const EmitFn& emit) {
  for (size_t shard = 0; shard < state_.size(); ++shard) {
    ShardState& s = state_[shard];
    const PlannedShard& plan = job_.plan[shard];
    for (size_t r = s.next_record; r < plan.records.size(); ++r) {
      CKPT_RETURN_IF_ERROR(StartRecord(shard, r, acquire, emit));
    }
    s.next_record = plan.records.size();
    shards_[shard].file_bytes = s.out_pos;
    CKPT_RETURN_IF_ERROR(Append(shard, nullptr, AlignUp(s.out_pos) - s.out_pos, true, acquire, emit));
    shards_[shard].padded_bytes = s.out_pos;
    if (s.buffer != SIZE_MAX) {
      const size_t last = s.buffer;
      s.buffer = SIZE_MAX;
      CKPT_RETURN_IF_ERROR(emit(shard, s.buffer_offset, last, s.fill));
    }
  }
  return absl::OkStatus();
}

}  // namespace ckpt::internal
