#include "engine/shard_encoder.h"

#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <deque>

#include "absl/strings/str_cat.h"
#include "delta/delta_codec.h"
#include "util/hash.h"
#include "util/status_macros.h"

namespace ckpt::internal {

ShardEncoder::ShardEncoder(const SaveJob& job, std::unique_ptr<ShardOutputs> outputs)
    : job_(job),
      outputs_(std::move(outputs)),
      shards_(job.plan.size()),
      records_(job.tensors.size(), RecordLayout{0, 0, RecordEncoding::kRaw, 0}),
      restored_hashes_(job.tensors.size(), 0) {}

absl::Status ShardEncoder::Consume(const StagedChunk& chunk, const char* data,
                                   std::vector<size_t>* release) {
  CKPT_RETURN_IF_ERROR(ConsumeChunk(chunk, data, release));
  if (chunk.file_offset + chunk.bytes == job_.plan[chunk.shard].padded_bytes) {
    CKPT_ASSIGN_OR_RETURN(shards_[chunk.shard], outputs_->FinishShard(chunk.shard));
  }
  return absl::OkStatus();
}

absl::Status ShardEncoder::Finish() {
  for (size_t s = 0; s < job_.plan.size(); ++s) {
    CKPT_ASSIGN_OR_RETURN(shards_[s], outputs_->FinishShard(s));
  }
  return absl::OkStatus();
}

namespace {

// Calls `fn(record_index, lo, hi)` for each record of `shard` with bytes in
// [begin, end) (file offsets of the raw layout), in order.
template <typename Fn>
absl::Status ForEachRecordPart(const PlannedShard& shard, uint64_t begin, uint64_t end, Fn fn) {
  auto first = std::upper_bound(shard.records.begin(), shard.records.end(), begin,
                                [](uint64_t off, const PlannedRecord& r) { return off < r.offset; });
  if (first != shard.records.begin()) --first;
  for (auto it = first; it != shard.records.end() && it->offset < end; ++it) {
    const uint64_t lo = std::max<uint64_t>(begin, it->offset);
    const uint64_t hi = std::min<uint64_t>(end, it->offset + it->bytes);
    if (lo < hi) CKPT_RETURN_IF_ERROR(fn(static_cast<size_t>(it - shard.records.begin()), lo, hi));
  }
  return absl::OkStatus();
}

class ZstdShardEncoder final : public ShardEncoder {
 public:
  ZstdShardEncoder(const SaveJob& job, int level, std::unique_ptr<ShardOutputs> outputs)
      : ShardEncoder(job, std::move(outputs)),
        cctx_(ZSTD_createCCtx(), ZSTD_freeCCtx) {
    ZSTD_CCtx_setParameter(cctx_.get(), ZSTD_c_compressionLevel, level);
    ZSTD_CCtx_setParameter(cctx_.get(), ZSTD_c_checksumFlag, 0);  // XXH3 of the raw bytes covers it
  }

  absl::Status ConsumeChunk(const StagedChunk& chunk, const char* data,
                            std::vector<size_t>* release) override {
    const PlannedShard& plan = job_.plan[chunk.shard];
    release->push_back(chunk.chunk);  // nothing is kept past this call
    return ForEachRecordPart(
        plan, chunk.file_offset, chunk.file_offset + chunk.bytes,
        [&](size_t r, uint64_t lo, uint64_t hi) -> absl::Status {
          const PlannedRecord& rec = plan.records[r];
          RecordLayout& layout = records_[rec.tensor];
          if (lo == rec.offset) {
            CKPT_ASSIGN_OR_RETURN(layout.offset, outputs_->BeginRecord(chunk.shard));
            layout.encoding = RecordEncoding::kZstd;
          }
          scratch_.resize(ZSTD_compressBound(hi - lo));
          const size_t z = ZSTD_compress2(cctx_.get(), scratch_.data(), scratch_.size(),
                                          data + (lo - chunk.file_offset), hi - lo);
          if (ZSTD_isError(z)) return absl::InternalError(absl::StrCat("zstd: ", ZSTD_getErrorName(z)));
          layout.stored_bytes += z;
          return outputs_->Append(chunk.shard, scratch_.data(), z);
        });
  }

 private:
  std::unique_ptr<ZSTD_CCtx, size_t (*)(ZSTD_CCtx*)> cctx_;
  std::vector<char> scratch_;
};

class DeltaShardEncoder final : public ShardEncoder {
 public:
  DeltaShardEncoder(const SaveJob& job, const DeltaOptions& options, int level,
                    ReferenceState* reference, std::unique_ptr<ShardOutputs> outputs)
      : ShardEncoder(job, std::move(outputs)),
        options_(options),
        level_(level),
        reference_(reference) {}

  absl::Status ConsumeChunk(const StagedChunk& chunk, const char* data,
                            std::vector<size_t>* release) override {
    const PlannedShard& plan = job_.plan[chunk.shard];
    held_.push_back(chunk.chunk);
    absl::Status status = ForEachRecordPart(
        plan, chunk.file_offset, chunk.file_offset + chunk.bytes,
        [&](size_t r, uint64_t lo, uint64_t hi) -> absl::Status {
          const PlannedRecord& rec = plan.records[r];
          pieces_.push_back(Piece{data + (lo - chunk.file_offset), hi - lo});
          if (hi < rec.offset + rec.bytes) return absl::OkStatus();
          CKPT_RETURN_IF_ERROR(EncodeRecord(chunk.shard, rec));
          pieces_.clear();
          // Every held chunk but this one only holds finished records.
          for (size_t i = 0; i + 1 < held_.size(); ++i) release->push_back(held_[i]);
          held_.erase(held_.begin(), held_.end() - 1);
          return absl::OkStatus();
        });
    if (!status.ok()) {
      TakeHeld(release);
      return status;
    }
    if (pieces_.empty()) {  // no record continues past this chunk
      release->insert(release->end(), held_.begin(), held_.end());
      held_.clear();
    }
    return absl::OkStatus();
  }

 private:
  absl::Status EncodeRecord(size_t shard, const PlannedRecord& rec) {
    const TensorView& t = job_.tensors[rec.tensor];
    RecordLayout& layout = records_[rec.tensor];
    CKPT_ASSIGN_OR_RETURN(layout.offset, outputs_->BeginRecord(shard));
    char* ref = reference_->Find(t.name, t.dtype, t.shape);
    if (ref != nullptr) {
      const int level = level_;
      auto delta = options_.mode == DeltaOptions::Mode::kTopK
                       ? EncodeTopKDelta(pieces_, ref, t.nbytes, t.dtype, options_.topk_ratio, level)
                       : EncodeExactDelta(pieces_, ref, t.nbytes, t.dtype, level);
      if (!delta.ok()) return delta.status();
      if (delta->bytes.size() < t.nbytes) {
        layout.encoding = delta->encoding;
        layout.stored_bytes = delta->bytes.size();
        layout.error_bound = delta->error_bound;
        if (delta->encoding == RecordEncoding::kTopK) restored_hashes_[rec.tensor] = Xxh3(ref, t.nbytes);
        return outputs_->Append(shard, delta->bytes.data(), delta->bytes.size());
      }
      // Not smaller: store it whole (and the reference becomes X exactly).
    } else {
      ref = reference_->FindOrCreate(t.name, t.dtype, t.shape, t.nbytes);
    }
    layout.encoding = RecordEncoding::kRaw;
    layout.stored_bytes = t.nbytes;
    layout.error_bound = 0;
    size_t offset = 0;
    for (const Piece& p : pieces_) {
      if (ref != nullptr) std::memcpy(ref + offset, p.data, p.bytes);
      CKPT_RETURN_IF_ERROR(outputs_->Append(shard, p.data, p.bytes));
      offset += p.bytes;
    }
    return absl::OkStatus();
  }

  void TakeHeld(std::vector<size_t>* out) override {
    out->insert(out->end(), held_.begin(), held_.end());
    held_.clear();
    pieces_.clear();
  }

  const DeltaOptions options_;
  const int level_;
  ReferenceState* const reference_;
  std::vector<Piece> pieces_;   // of the record in progress
  std::vector<size_t> held_;    // staging chunks not yet releasable, in order
};

}  // namespace

absl::StatusOr<std::unique_ptr<ShardEncoder>> NewZstdShardEncoder(
    const SaveJob& job, int level, std::unique_ptr<ShardOutputs> outputs) {
  return std::unique_ptr<ShardEncoder>(new ZstdShardEncoder(job, level, std::move(outputs)));
}

absl::StatusOr<std::unique_ptr<ShardEncoder>> NewDeltaShardEncoder(
    const SaveJob& job, const DeltaOptions& options, int level, ReferenceState* reference,
    std::unique_ptr<ShardOutputs> outputs) {
  return std::unique_ptr<ShardEncoder>(
      new DeltaShardEncoder(job, options, level, reference, std::move(outputs)));
}

}  // namespace ckpt::internal
