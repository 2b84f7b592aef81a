// The manifest of one save, built from what the persister learnt writing it:
// a pure function (no clock, no I/O), so tests check it without a disk.
#ifndef CKPT_ENGINE_SAVE_MANIFEST_H_
#define CKPT_ENGINE_SAVE_MANIFEST_H_

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "ckpt/options.h"
#include "ckpt/tensor.h"
#include "engine/shard_outputs.h"
#include "format/manifest.h"
#include "format/shard_plan.h"

namespace ckpt::internal {

// What the writing of a save's records produced.
struct WrittenRecords {
  std::span<const uint64_t> hashes;  // XXH3-64 of each tensor's staged bytes
  // A sharded chunk's block size (0: none) and block hashes, per tensor;
  // both empty when the save records none.
  std::span<const uint64_t> block_bytes;
  std::span<const std::vector<uint64_t>> block_hashes;
  // Where and how the encoder stored each shard and record (by tensor), and
  // a record's checksum where it differs from the staged bytes' (0: it does
  // not); all empty when the records were written raw, as planned.
  std::span<const ShardLayout> shards;
  std::span<const RecordLayout> records;
  std::span<const uint64_t> restored_hashes;
};

// What a delta save is taken against.
struct DeltaBase {
  int64_t step = 0;
  uint64_t manifest_xxh3 = 0;
  DeltaOptions::Mode mode = DeltaOptions::Mode::kNone;
};

// The manifest of the save of `tensors` (laid out by `plan`) at `step`:
// every record where and how it is stored, the shards with their final
// sizes, block hashes on raw records that have them, placements when
// `multi_rank`, and -- when `delta` is set and some record is stored as a
// delta -- kind kDelta with its base (a delta whose every record fell back
// to whole bytes depends on nothing: kind kFull). Leaves `created_unix_ns`,
// `writer` and `extras_json` to the caller.
Manifest BuildSaveManifest(int64_t step, std::span<const TensorView> tensors,
                           std::span<const PlannedShard> plan, const WrittenRecords& written,
                           bool multi_rank, const std::optional<DeltaBase>& delta);

}  // namespace ckpt::internal

#endif  // CKPT_ENGINE_SAVE_MANIFEST_H_
