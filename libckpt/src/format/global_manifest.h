// The MANIFEST.json of a multi-rank checkpoint (format version 2): which
// ranks wrote it and where each rank's own manifest is. Each rank's part is
// an ordinary format-1 manifest (`rank-<r>.MANIFEST.json`) in the same
// directory. See docs/format.md ("Multi-rank checkpoints").
#ifndef CKPT_FORMAT_GLOBAL_MANIFEST_H_
#define CKPT_FORMAT_GLOBAL_MANIFEST_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ckpt/kinds.h"
#include "ckpt/options.h"

namespace ckpt::internal {

inline constexpr int kMultiRankFormatVersion = 2;

// One rank's part, as the global manifest records it.
struct RankPart {
  int rank = 0;
  std::string manifest;        // RankManifestName(rank)
  uint64_t manifest_xxh3 = 0;  // that manifest's checksum
  CheckpointKind kind = CheckpointKind::kFull;
  int64_t base_step = -1;      // a delta part's base step
  uint64_t tensor_bytes = 0;
  uint64_t file_bytes = 0;     // its shard files and manifest
  size_t tensor_count = 0;
  size_t shard_count = 0;
};

struct GlobalManifest {
  int format_version = kMultiRankFormatVersion;
  int64_t step = 0;
  int world_size = 0;
  // kDelta if any part is a delta; then every delta part has `base_step`.
  CheckpointKind kind = CheckpointKind::kFull;
  int64_t base_step = -1;
  DeltaOptions::Mode delta_mode = DeltaOptions::Mode::kNone;
  int64_t created_unix_ns = 0;
  std::string writer;
  std::string extras_json = "{}";  // rank 0's extras
  std::vector<RankPart> ranks;     // one per rank, in rank order
  uint64_t manifest_xxh3 = 0;      // set by Serialize/Parse
};

// The top-level "format_version" of the manifest `contents`, found by
// parsing it only as far as that member (wherever it stands, however the
// JSON is spaced); nullopt when the text is not a JSON object holding an
// integer "format_version".
std::optional<int64_t> ManifestFormatVersion(absl::string_view contents);

// Whether `contents` is a multi-rank (format 2) manifest by its
// "format_version". Only routes the parse: ParseGlobalManifest (or
// ParseManifest, for anything else) checks everything.
bool IsGlobalManifest(absl::string_view contents);

// As SerializeManifest; sets `manifest->manifest_xxh3`.
absl::StatusOr<std::string> SerializeGlobalManifest(GlobalManifest* manifest);

// Checks the checksum, then parses and bounds-checks: world size, one part
// per rank in order with its manifest's name, kinds and bases consistent.
// kDataLoss naming `path`; kUnimplemented for a newer version.
absl::StatusOr<GlobalManifest> ParseGlobalManifest(absl::string_view contents,
                                                   absl::string_view path);

}  // namespace ckpt::internal

#endif  // CKPT_FORMAT_GLOBAL_MANIFEST_H_
