// Loading and checking the manifest of one committed checkpoint directory.
#ifndef CKPT_READ_LOAD_MANIFEST_H_
#define CKPT_READ_LOAD_MANIFEST_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ckpt/file_system.h"
#include "format/global_manifest.h"
#include "format/manifest.h"
#include "format/names.h"

namespace ckpt::internal {

// Reads and parses `dir`/`name` (MANIFEST.json, or a rank's manifest in a
// multi-rank checkpoint), checks that its step is `expected_step`, and that
// every shard file exists with exactly the size the manifest records (a
// truncated or extended shard is kDataLoss naming it). Does not read tensor
// data. A multi-rank checkpoint's MANIFEST.json is refused here
// (kUnimplemented: format version 2; see LoadStepManifest).
absl::StatusOr<Manifest> LoadManifest(FileSystem& fs, const std::string& dir,
                                      int64_t expected_step,
                                      absl::string_view name = kManifestName);

// What a step directory's MANIFEST.json says: a single-process checkpoint's
// manifest, or a multi-rank checkpoint's list of parts (whose own manifests
// are then loaded and checked too: each must exist, verify, have the
// checksum the list records, and its shards their sizes; with `only_rank`,
// only that rank's, the other parts left empty: a rank's copy of a step
// when the ranks share no ROOT holds only its own).
struct StepManifest {
  bool multi_rank = false;
  Manifest single;         // !multi_rank
  GlobalManifest global;   // multi_rank
  std::vector<Manifest> parts;  // multi_rank: one per rank
};
absl::StatusOr<StepManifest> LoadStepManifest(FileSystem& fs, const std::string& dir,
                                              int64_t expected_step,
                                              std::optional<int> only_rank = std::nullopt);

// Rank `rank`'s part of the multi-rank checkpoint in `dir`: its manifest,
// checked against the step manifest's list (which must verify, be for
// `expected_step` and have that rank), and its shards' sizes. kDataLoss
// naming what is wrong.
absl::StatusOr<Manifest> LoadRankPart(FileSystem& fs, const std::string& dir,
                                      int64_t expected_step, int rank);

}  // namespace ckpt::internal

#endif  // CKPT_READ_LOAD_MANIFEST_H_
