// The MANIFEST.json of a checkpoint: what it holds and where. See
// docs/format.md for the field-by-field description.
#ifndef CKPT_FORMAT_MANIFEST_H_
#define CKPT_FORMAT_MANIFEST_H_

#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "ckpt/reader.h"
#include "format/shard_plan.h"

namespace ckpt::internal {

inline constexpr int kFormatVersion = 1;
inline constexpr uint64_t kRecordAlignment = 4096;
// A writer hashes each block of this many bytes of a sharded record stored
// whole (TensorInfo::block_xxh3), so a reader can check part of it. Small
// enough that a region read rounds out by little; large enough that a
// gigabyte of chunk costs 4096 hashes in the manifest.
inline constexpr uint64_t kBlockBytes = uint64_t{256} << 10;
// Bounds a reader enforces before it allocates anything a manifest implies.
inline constexpr uint64_t kMaxManifestBytes = uint64_t{1} << 30;
inline constexpr uint64_t kMaxShardBytes = uint64_t{1} << 50;
inline constexpr size_t kMaxTensors = 50'000'000;
inline constexpr size_t kMaxRank = 64;

struct ShardInfo {
  std::string file;    // a plain file name inside the checkpoint directory
  uint64_t bytes = 0;  // its exact size on disk
};

struct Manifest {
  int format_version = kFormatVersion;
  int64_t step = 0;
  CheckpointKind kind = CheckpointKind::kFull;
  // For a delta: the checkpoint it applies to, and that manifest's checksum.
  int64_t base_step = -1;
  uint64_t base_manifest_xxh3 = 0;
  DeltaOptions::Mode delta_mode = DeltaOptions::Mode::kNone;  // kExact or kTopK for a delta
  // For a full checkpoint written by compaction (`CompactToFull`): the delta
  // it replaced. Deltas written against that delta name its manifest
  // checksum as their base's, which readers accept in place of this one's.
  bool compacted = false;
  uint64_t compacted_from_manifest_xxh3 = 0;
  int64_t compacted_from_base_step = -1;
  DeltaOptions::Mode compacted_from_delta_mode = DeltaOptions::Mode::kNone;
  int64_t compacted_unix_ns = 0;
  // This manifest's own checksum (set by Serialize/Parse).
  uint64_t manifest_xxh3 = 0;
  int64_t created_unix_ns = 0;
  std::string writer;  // "ckpt <version>"
  uint64_t alignment = kRecordAlignment;
  std::string extras_json = "{}";  // a JSON object
  std::vector<ShardInfo> shards;
  std::vector<TensorInfo> tensors;

  // True if a delta whose base manifest checksum is `hash` may apply to this
  // checkpoint: `hash` is this manifest's, or that of the delta it compacts.
  bool MatchesBaseHash(uint64_t hash) const {
    return manifest_xxh3 == hash || (compacted && compacted_from_manifest_xxh3 == hash);
  }

  uint64_t tensor_bytes() const;
  uint64_t shard_bytes() const;
};

// Records the planned shard `shard` in `manifest`: appends it to `shards`
// (`file_bytes` long) and places each of its tensors' records raw at their
// planned offsets (`shard`, `offset`, `stored_bytes = raw_bytes`, "raw", no
// `stored_xxh3`).
// `manifest->tensors[r.tensor]` must already say what each tensor is (name,
// dtype, shape, raw_bytes, xxh3); a writer that encoded a record overrides
// where and how it is stored afterwards.
void PlaceRawRecords(const PlannedShard& shard, uint64_t file_bytes, Manifest* manifest);

// The manifest as file contents: JSON whose last member, "manifest_xxh3", is
// the XXH3-64 of every byte before the comma that precedes it.
// REQUIRES: names and extras are valid UTF-8 (checked by the engine).
// Sets `manifest->manifest_xxh3`.
absl::StatusOr<std::string> SerializeManifest(Manifest* manifest);

// `object` as manifest file contents: one member per line at the top level,
// then the checksum trailer every manifest ends with — a last member
// "manifest_xxh3", `*hash`, the XXH3-64 of every byte before the comma that
// precedes it. kInvalidArgument if `object` cannot be encoded.
absl::StatusOr<std::string> SealManifest(const nlohmann::ordered_json& object, uint64_t* hash);
// kDataLoss "manifest <path>: <what>": how manifest parsers report damage.
absl::Status CorruptManifest(absl::string_view path, absl::string_view what);
// Checks the size bound, the trailer's shape and the checksum of
// `contents`; returns the checksum. kDataLoss naming `path`.
absl::StatusOr<uint64_t> CheckManifestChecksum(absl::string_view contents, absl::string_view path);

// Checks the checksum, then parses and bounds-checks everything (names,
// dtypes, shapes against sizes, shard names, record extents) before the
// caller allocates anything. Errors are kDataLoss naming `path`, or
// kUnimplemented for a newer format version.
absl::StatusOr<Manifest> ParseManifest(absl::string_view contents, absl::string_view path);

}  // namespace ckpt::internal

#endif  // CKPT_FORMAT_MANIFEST_H_
