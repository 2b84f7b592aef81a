// `ShardEncoder`: turns a save's raw staged chunks into shard files whose
// records are encoded (zstd-compressed, byte planes, or deltas against the reference
// state), on the persister thread. Output goes through `ShardOutputs`.
#ifndef CKPT_ENGINE_SHARD_ENCODER_H_
#define CKPT_ENGINE_SHARD_ENCODER_H_

#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "ckpt/options.h"
#include "engine/reference_state.h"
#include "engine/save_job.h"
#include "engine/adaptive_compression.h"
#include "engine/shard_outputs.h"
#include "util/worker_pool.h"

namespace ckpt::internal {

class ShardEncoder {
 public:
  ShardEncoder(const SaveJob& job, std::unique_ptr<ShardOutputs> outputs);
  virtual ~ShardEncoder() = default;

  // Consumes staged `chunk` (its bytes at `data`). REQUIRES: the chunks of a
  // shard arrive in file-offset order. Appends to `release` the staging
  // chunks that may be given back now (this one, or earlier ones whose
  // records are now all encoded). On error, `release` gets every staging
  // chunk the encoder holds (that one included): the caller gives back
  // exactly what `release` lists. A shard's last chunk finishes the shard
  // (its output is flushed at once, so it holds no output buffer).
  absl::Status Consume(const StagedChunk& chunk, const char* data, std::vector<size_t>* release);
  // As `Consume` for each of `chunks` (data `data[i]`) in order; an encoder
  // may encode them in parallel. On error, `release` lists every chunk of
  // the batch the caller must give back (and any held earlier).
  virtual absl::Status ConsumeBatch(std::span<const StagedChunk> chunks,
                                    std::span<const char* const> data, std::vector<size_t>* release);
  // Flushes every shard not finished yet. Call once, after the last chunk.
  absl::Status Finish();
  // Staging chunks still held (after a failure elsewhere); the encoder
  // forgets them.
  virtual void TakeHeld(std::vector<size_t>* out) {}

  const std::vector<ShardLayout>& shards() const { return shards_; }
  const std::vector<RecordLayout>& records() const { return records_; }  // by tensor index
  // A record's checksum when it differs from the staged bytes' (top-k: the
  // restored value is not what was staged); 0 = use the staged hash.
  const std::vector<uint64_t>& restored_hashes() const { return restored_hashes_; }
  ShardOutputs& outputs() { return *outputs_; }

 protected:
  virtual absl::Status ConsumeChunk(const StagedChunk& chunk, const char* data,
                                    std::vector<size_t>* release) = 0;

  const SaveJob& job_;
  std::unique_ptr<ShardOutputs> outputs_;
  std::vector<ShardLayout> shards_;
  std::vector<RecordLayout> records_;
  std::vector<uint64_t> restored_hashes_;
};

// How one save's records are encoded, as the persister chose it.
struct EncoderChoice {
  bool delta = false;  // against `reference` (else full records of `codec`)
  CompressionCodec codec = CompressionCodec::kNone;
  int level = 1;                         // zstd level of records, planes and delta payloads
  DeltaOptions delta_options;            // when `delta`
  ReferenceState* reference = nullptr;   // when `delta`
  AdaptiveCompression* adaptive = nullptr;  // for kPlanes
  // The encoding threads, created on first use (the persister's pool).
  std::function<WorkerPool*()> pool;
};

// Whether a save of `choice` needs an encoder: false only for raw full
// records, which are written as they were staged.
bool EncodesRecords(const EncoderChoice& choice);

// The encoder of `choice` (REQUIRES: `EncodesRecords(choice)`), writing
// through `outputs`. The one place a codec option becomes an encoder.
absl::StatusOr<std::unique_ptr<ShardEncoder>> NewShardEncoder(const SaveJob& job,
                                                              const EncoderChoice& choice,
                                                              std::unique_ptr<ShardOutputs> outputs);

// Each record as independent zstd frames, one per staged chunk that held
// part of it (so readers can stream them).
absl::StatusOr<std::unique_ptr<ShardEncoder>> NewZstdShardEncoder(
    const SaveJob& job, int level, std::unique_ptr<ShardOutputs> outputs);

// Each record as byte-plane blocks (delta/plane_codec.h), one block per
// staged chunk's part of it, the chunks of a batch encoded in parallel on
// `pool`; blocks `adaptive` finds not worth it are stored raw inside the
// record. `adaptive` and `pool` outlive the encoder.
absl::StatusOr<std::unique_ptr<ShardEncoder>> NewPlanesShardEncoder(
    const SaveJob& job, int level, WorkerPool* pool, AdaptiveCompression* adaptive,
    std::unique_ptr<ShardOutputs> outputs);

// Each record as a delta against `reference` (exact or top-k per `options`,
// payloads zstd level `level`), falling back to the raw bytes where the
// tensor has no reference or the delta would not be smaller. Holds a
// record's chunks until it is complete. Updates `reference` to what a
// restore of this checkpoint will yield. Large records encode their blocks
// in parallel on `pool`.
absl::StatusOr<std::unique_ptr<ShardEncoder>> NewDeltaShardEncoder(
    const SaveJob& job, const DeltaOptions& options, int level, ReferenceState* reference,
    WorkerPool* pool, std::unique_ptr<ShardOutputs> outputs);

}  // namespace ckpt::internal

#endif  // CKPT_ENGINE_SHARD_ENCODER_H_
