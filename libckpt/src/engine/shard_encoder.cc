#include "engine/shard_encoder.h"

#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <deque>

#include "absl/strings/str_cat.h"
#include "codec/zstd_context.h"
#include "delta/delta_codec.h"
#include "delta/plane_codec.h"
#include "util/hash.h"
#include "util/status_macros.h"

namespace ckpt::internal {

ShardEncoder::ShardEncoder(const SaveJob& job, std::unique_ptr<ShardOutputs> outputs)
    : job_(job),
      outputs_(std::move(outputs)),
      shards_(job.plan.size()),
      records_(job.tensors.size(), RecordLayout{}),
      restored_hashes_(job.tensors.size(), 0) {}

absl::Status ShardEncoder::Consume(const StagedChunk& chunk, const char* data,
                                   std::vector<size_t>* release) {
  CKPT_RETURN_IF_ERROR(ConsumeChunk(chunk, data, release));
  if (chunk.file_offset + chunk.bytes == job_.plan[chunk.shard].padded_bytes) {
    CKPT_ASSIGN_OR_RETURN(shards_[chunk.shard], outputs_->FinishShard(chunk.shard));
  }
  return absl::OkStatus();
}

absl::Status ShardEncoder::ConsumeBatch(std::span<const StagedChunk> chunks,
                                        std::span<const char* const> data,
                                        std::vector<size_t>* release) {
  for (size_t i = 0; i < chunks.size(); ++i) {
    absl::Status s = Consume(chunks[i], data[i], release);
    if (!s.ok()) {
      for (size_t j = i + 1; j < chunks.size(); ++j) release->push_back(chunks[j].chunk);
      return s;
    }
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
      : ShardEncoder(job, std::move(outputs)), level_(level) {}

  absl::Status ConsumeChunk(const StagedChunk& chunk, const char* data,
                            std::vector<size_t>* release) override {
    const PlannedShard& plan = job_.plan[chunk.shard];
    // (The thread's context is shared with other codecs: set what is relied on.)
    ZSTD_CCtx* cctx = ThreadZstdCCtx();
    if (cctx == nullptr) return absl::ResourceExhaustedError("ZSTD_createCCtx failed");
    ZSTD_CCtx_reset(cctx, ZSTD_reset_session_and_parameters);
    ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, level_);
    ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 0);  // XXH3 of the raw bytes covers it
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
          const size_t z = ZSTD_compress2(cctx, scratch_.data(), scratch_.size(),
                                          data + (lo - chunk.file_offset), hi - lo);
          if (ZSTD_isError(z)) return absl::InternalError(absl::StrCat("zstd: ", ZSTD_getErrorName(z)));
          layout.stored_bytes += z;
          return outputs_->Append(chunk.shard, scratch_.data(), z);
        });
  }

 private:
  const int level_;
  std::vector<char> scratch_;
};

class PlanesShardEncoder final : public ShardEncoder {
 public:
  PlanesShardEncoder(const SaveJob& job, int level, WorkerPool* pool, AdaptiveCompression* adaptive,
                     std::unique_ptr<ShardOutputs> outputs)
      : ShardEncoder(job, std::move(outputs)), level_(level), pool_(pool), adaptive_(adaptive) {
    adaptive_->BeginSave(job.tensors.size());
  }

  absl::Status ConsumeChunk(const StagedChunk& chunk, const char* data,
                            std::vector<size_t>* release) override {
    // (Only reached through ConsumeBatch's group of one.)
    return absl::InternalError("PlanesShardEncoder::ConsumeChunk");
  }

  absl::Status ConsumeBatch(std::span<const StagedChunk> chunks, std::span<const char* const> data,
                            std::vector<size_t>* release) override {
    // Groups of a few chunks per thread: enough to keep every thread busy,
    // little encoded output held at once.
    const size_t group = 2 * static_cast<size_t>(pool_->threads());
    for (size_t begin = 0; begin < chunks.size(); begin += group) {
      const size_t end = std::min(chunks.size(), begin + group);
      absl::Status s = EncodeGroup(chunks.subspan(begin, end - begin), data.subspan(begin, end - begin),
                                   release);
      if (!s.ok()) {
        for (size_t j = end; j < chunks.size(); ++j) release->push_back(chunks[j].chunk);
        return s;
      }
    }
    return absl::OkStatus();
  }

 private:
  // One block: bytes [lo, hi) of the shard's raw layout, of record `record`.
  struct Part {
    size_t chunk;   // index in the group
    size_t record;  // in the shard's plan
    uint64_t lo, hi;
    bool compress;
    absl::Status status;
  };

  absl::Status EncodeGroup(std::span<const StagedChunk> chunks, std::span<const char* const> data,
                           std::vector<size_t>* release) {
    parts_.clear();
    for (size_t c = 0; c < chunks.size(); ++c) {
      const PlannedShard& plan = job_.plan[chunks[c].shard];
      (void)ForEachRecordPart(plan, chunks[c].file_offset, chunks[c].file_offset + chunks[c].bytes,
                              [&](size_t r, uint64_t lo, uint64_t hi) -> absl::Status {
                                const size_t tensor = plan.records[r].tensor;
                                const bool worth = adaptive_->TensorWorthwhile(tensor);
                                for (uint64_t b = lo; b < hi; b += kPlaneBlockBytes) {
                                  parts_.push_back(Part{c, r, b, std::min<uint64_t>(hi, b + kPlaneBlockBytes),
                                                        worth, absl::OkStatus()});
                                }
                                return absl::OkStatus();
                              });
    }
    if (blocks_.size() < parts_.size()) blocks_.resize(parts_.size());
    pool_->ParallelFor(parts_.size(), [&](size_t i) {
      Part& part = parts_[i];
      const StagedChunk& chunk = chunks[part.chunk];
      const PlannedRecord& rec = job_.plan[chunk.shard].records[part.record];
      // (Blocks hold whole elements: records start 4 KiB-aligned and chunks
      // are multiples of 4 KiB; AppendPlaneBlock refuses anything else.)
      const size_t elem = DTypeScalarSize(job_.tensors[rec.tensor].dtype);
      blocks_[i].clear();
      part.status = AppendPlaneBlock(data[part.chunk] + (part.lo - chunk.file_offset), part.hi - part.lo,
                                     elem, level_, !part.compress, &blocks_[i]);
    });
    // The staged bytes are encoded: every chunk of the group may go back.
    for (const StagedChunk& chunk : chunks) release->push_back(chunk.chunk);
    for (size_t i = 0; i < parts_.size(); ++i) {
      const Part& part = parts_[i];
      CKPT_RETURN_IF_ERROR(part.status);
      const StagedChunk& chunk = chunks[part.chunk];
      const PlannedRecord& rec = job_.plan[chunk.shard].records[part.record];
      RecordLayout& layout = records_[rec.tensor];
      if (part.lo == rec.offset) {
        CKPT_ASSIGN_OR_RETURN(layout.offset, outputs_->BeginRecord(chunk.shard));
        layout.encoding = RecordEncoding::kPlanes;
      }
      if (part.compress) adaptive_->Block(rec.tensor, part.hi - part.lo, blocks_[i].size());
      layout.stored_bytes += blocks_[i].size();
      CKPT_RETURN_IF_ERROR(outputs_->Append(chunk.shard, blocks_[i].data(), blocks_[i].size()));
    }
    for (const StagedChunk& chunk : chunks) {
      if (chunk.file_offset + chunk.bytes == job_.plan[chunk.shard].padded_bytes &&
          !outputs_->finished(chunk.shard)) {
        CKPT_ASSIGN_OR_RETURN(shards_[chunk.shard], outputs_->FinishShard(chunk.shard));
      }
    }
    return absl::OkStatus();
  }

  const int level_;
  WorkerPool* const pool_;
  AdaptiveCompression* const adaptive_;
  std::vector<Part> parts_;
  std::vector<std::vector<char>> blocks_;  // encoded parts, reused group to group
};

class DeltaShardEncoder final : public ShardEncoder {
 public:
  DeltaShardEncoder(const SaveJob& job, const DeltaOptions& options, int level,
                    ReferenceState* reference, WorkerPool* pool, std::unique_ptr<ShardOutputs> outputs)
      : ShardEncoder(job, std::move(outputs)),
        options_(options),
        level_(level),
        reference_(reference),
        pool_(pool) {}

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
    const bool differential = options_.base == DeltaOptions::Base::kDifferential;
    char* ref = reference_->Find(t.name, t.dtype, t.shape);
    if (ref != nullptr) {
      // A differential delta leaves the reference (the full save's values)
      // as it is: the encoder works on a copy, which it brings to what a
      // restore of this delta yields.
      char* against = ref;
      if (differential) {
        against = reference_->Scratch(t.nbytes);
        if (against == nullptr) {
          return absl::ResourceExhaustedError(absl::StrCat(
              "no memory for a copy of the reference of tensor \"", t.name, "\" (", t.nbytes, " bytes)"));
        }
        std::memcpy(against, ref, t.nbytes);
      }
      const int level = level_;
      auto delta = options_.mode == DeltaOptions::Mode::kTopK
                       ? EncodeTopKDelta(pieces_, against, t.nbytes, t.dtype, options_.topk_ratio, level)
                       : EncodeExactDelta(pieces_, against, t.nbytes, t.dtype, level, pool_);
      if (!delta.ok()) return delta.status();
      if (delta->bytes.size() < t.nbytes) {
        layout.encoding = delta->encoding;
        layout.stored_bytes = delta->bytes.size();
        layout.error_bound = delta->error_bound;
        layout.stored_xxh3 = Xxh3(delta->bytes.data(), delta->bytes.size());
        if (delta->encoding == RecordEncoding::kTopK) restored_hashes_[rec.tensor] = Xxh3(against, t.nbytes);
        absl::Status appended = outputs_->Append(shard, delta->bytes.data(), delta->bytes.size());
        RecycleDeltaBytes(std::move(delta->bytes));  // the next record encodes into faulted pages
        return appended;
      }
      // Not smaller: store it whole (a chained reference becomes X exactly;
      // a differential one stays the full save's, which the next delta of
      // this tensor applies to).
      if (differential) ref = nullptr;
    } else if (!differential) {
      // (A tensor the full save did not have stays whole until the next
      // full save when deltas are differential: they apply to that save.)
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
  WorkerPool* const pool_;
  std::vector<Piece> pieces_;   // of the record in progress
  std::vector<size_t> held_;    // staging chunks not yet releasable, in order
};

}  // namespace

absl::StatusOr<std::unique_ptr<ShardEncoder>> NewZstdShardEncoder(
    const SaveJob& job, int level, std::unique_ptr<ShardOutputs> outputs) {
  return std::unique_ptr<ShardEncoder>(new ZstdShardEncoder(job, level, std::move(outputs)));
}

absl::StatusOr<std::unique_ptr<ShardEncoder>> NewPlanesShardEncoder(
    const SaveJob& job, int level, WorkerPool* pool, AdaptiveCompression* adaptive,
    std::unique_ptr<ShardOutputs> outputs) {
  return std::unique_ptr<ShardEncoder>(
      new PlanesShardEncoder(job, level, pool, adaptive, std::move(outputs)));
}

absl::StatusOr<std::unique_ptr<ShardEncoder>> NewDeltaShardEncoder(
    const SaveJob& job, const DeltaOptions& options, int level, ReferenceState* reference,
    WorkerPool* pool, std::unique_ptr<ShardOutputs> outputs) {
  return std::unique_ptr<ShardEncoder>(
      new DeltaShardEncoder(job, options, level, reference, pool, std::move(outputs)));
}

bool EncodesRecords(const EncoderChoice& choice) {
  if (choice.delta) return true;
  switch (choice.codec) {
    case CompressionCodec::kNone: return false;
    case CompressionCodec::kZstd:
    case CompressionCodec::kPlanes: return true;
  }
  return false;
}

absl::StatusOr<std::unique_ptr<ShardEncoder>> NewShardEncoder(const SaveJob& job,
                                                              const EncoderChoice& choice,
                                                              std::unique_ptr<ShardOutputs> outputs) {
  if (choice.delta) {
    return NewDeltaShardEncoder(job, choice.delta_options, choice.level, choice.reference,
                                choice.pool(), std::move(outputs));
  }
  switch (choice.codec) {
    case CompressionCodec::kNone:
      break;
    case CompressionCodec::kZstd:
      return NewZstdShardEncoder(job, choice.level, std::move(outputs));
    case CompressionCodec::kPlanes:
      return NewPlanesShardEncoder(job, choice.level, choice.pool(), choice.adaptive,
                                   std::move(outputs));
  }
  return absl::InternalError("raw full records need no encoder");
}

}  // namespace ckpt::internal
