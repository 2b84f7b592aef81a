// ckpt/catalog.h: which checkpoints a root holds.
#ifndef CKPT_CATALOG_H_
#define CKPT_CATALOG_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckpt/file_system.h"
#include "ckpt/kinds.h"
#include "ckpt/options.h"

namespace ckpt {

// A committed checkpoint directory, summarised from its manifest.
struct CheckpointSummary {
  int64_t step = 0;
  std::string dir;  // full path
  // OK if the manifest was read and passed its checksum and bounds checks;
  // otherwise why not (the other fields are then zero).
  absl::Status manifest_status;
  // How many ranks wrote it (ckpt/distributed.h); 1 for one process. A
  // multi-rank checkpoint is one unit: the figures below add up its parts,
  // it is a delta if any part is, and every delta part has `base_step`.
  int world_size = 1;
  CheckpointKind kind = CheckpointKind::kFull;
  int64_t base_step = -1;    // for a delta: the checkpoint it applies to
  // For a delta: kExact or kTopK; kNone for a full checkpoint.
  DeltaOptions::Mode delta_mode = DeltaOptions::Mode::kNone;
  double max_error_bound = 0;  // largest per-tensor error bound (0: exact)
  uint64_t tensor_bytes = 0;
  uint64_t file_bytes = 0;  // shard files + manifest
  size_t tensor_count = 0;
  size_t shard_count = 0;
  int64_t created_unix_ns = 0;
  uint64_t manifest_xxh3 = 0;  // the manifest's own checksum
  // A full checkpoint written by compaction (see ckpt/compact.h) in place of
  // a delta whose manifest checksum was `compacted_from_manifest_xxh3`.
  bool compacted = false;
  uint64_t compacted_from_manifest_xxh3 = 0;
};

// Steps of the committed checkpoint directories in `root`, ascending. Temp
// and trash directories are never listed. `fs` null means `PosixFileSystem()`.
absl::StatusOr<std::vector<int64_t>> ListSteps(const std::string& root,
                                               std::shared_ptr<FileSystem> fs = nullptr);

// Summaries of every committed checkpoint in `root`, ascending by step.
absl::StatusOr<std::vector<CheckpointSummary>> ListCheckpoints(
    const std::string& root, std::shared_ptr<FileSystem> fs = nullptr);

// The summary of checkpoint `step` of `root` alone (its manifest is read and
// checked; a damaged one is reported in `manifest_status`). kNotFound if
// there is no such checkpoint directory.
absl::StatusOr<CheckpointSummary> SummarizeCheckpoint(const std::string& root, int64_t step,
                                                      std::shared_ptr<FileSystem> fs = nullptr);

// The step named by ROOT/LATEST, if that file exists and parses. A hint only:
// readers scan the directories and verify.
absl::StatusOr<std::optional<int64_t>> ReadLatestHint(const std::string& root,
                                                      std::shared_ptr<FileSystem> fs = nullptr);

// Ranks that share no ROOT (`DistributedOptions::shared_root = false`) each
// commit a copy of every step that holds the checkpoint's manifest and their
// own part only: whole, the checkpoint is only in the bucket the ranks
// uploaded it to. The rank whose copy `root` is, judged by its newest
// committed step (a multi-rank checkpoint of which it holds the files of
// one rank only, that rank's manifest among them, which verifies); nullopt
// for any other root, an empty one included, and a whole checkpoint that
// lost a rank's manifest (its shards are still there). Readers and tools use it to say what such a root is rather
// than call its steps damaged.
absl::StatusOr<std::optional<int>> RankCopyOf(const std::string& root,
                                              std::shared_ptr<FileSystem> fs = nullptr);
// What such a root is, for messages: "<root> is rank <rank>'s own copy of
// checkpoints saved by ranks that share no file system: ... whole only in
// the bucket the ranks uploaded it to" (callers add what to do instead).
std::string DescribeRankCopy(const std::string& root, int rank);

// The directory name of checkpoint `step`, e.g. "step-00000000000000001200".
std::string StepDirName(int64_t step);

}  // namespace ckpt

#endif  // CKPT_CATALOG_H_
