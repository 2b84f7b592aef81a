#include "ckpt/catalog.h"
#include "ckpt/object_store.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "format/names.h"
#include "io/small_file.h"
#include "distributed/rank_layout.h"
#include "read/load_manifest.h"
#include "read/rank_copy.h"
#include "util/status_macros.h"

namespace ckpt {

std::string StepDirName(int64_t step) { return internal::CheckpointDirName(step); }

absl::StatusOr<std::vector<int64_t>> ListSteps(const std::string& root,
                                               std::shared_ptr<FileSystem> fs) {
  if (fs == nullptr) {
    CKPT_ASSIGN_OR_RETURN(fs, FileSystemForRoot(root));
  }
  auto stat = fs->Stat(root);
  if (!stat.ok()) return internal::Annotate(stat.status(), "checkpoint root");
  if (!stat->is_directory) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint root ", root, " is not a directory"));
  }
  CKPT_ASSIGN_OR_RETURN(std::vector<std::string> names, fs->ListDir(root));
  std::vector<int64_t> steps;
  for (const std::string& name : names) {
    if (auto step = internal::ParseCheckpointDirName(name)) steps.push_back(*step);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

namespace {

// `only_rank`: the step is that rank's copy (read/rank_copy.h).
CheckpointSummary Summarize(FileSystem& fs, const std::string& root, int64_t step,
                            std::optional<int> only_rank = std::nullopt) {
  CheckpointSummary s;
  s.step = step;
  s.dir = internal::JoinPath(root, internal::CheckpointDirName(step));
  auto loaded = internal::LoadStepManifest(fs, s.dir, step, only_rank);
  if (!loaded.ok()) {
    s.manifest_status = loaded.status();
    return s;
  }
  // A multi-rank checkpoint is one unit: its parts add up.
  std::vector<const internal::Manifest*> parts;
  if (loaded->multi_rank) {
    for (const internal::Manifest& m : loaded->parts) parts.push_back(&m);
    s.world_size = loaded->global.world_size;
    s.kind = loaded->global.kind;
    s.base_step = loaded->global.base_step;
    s.delta_mode = loaded->global.delta_mode;
    s.created_unix_ns = loaded->global.created_unix_ns;
    s.manifest_xxh3 = loaded->global.manifest_xxh3;
  } else {
    const internal::Manifest& m = loaded->single;
    parts.push_back(&m);
    s.kind = m.kind;
    s.base_step = m.base_step;
    s.delta_mode = m.delta_mode;
    s.created_unix_ns = m.created_unix_ns;
    s.manifest_xxh3 = m.manifest_xxh3;
    s.compacted = m.compacted;
    s.compacted_from_manifest_xxh3 = m.compacted_from_manifest_xxh3;
  }
  std::vector<std::string> manifests = {std::string(internal::kManifestName)};
  for (size_t r = 0; loaded->multi_rank && r < parts.size(); ++r) {
    if (only_rank.has_value() && static_cast<int>(r) != *only_rank) continue;
    manifests.push_back(internal::RankManifestName(static_cast<int>(r)));
  }
  for (const internal::Manifest* m : parts) {
    for (const TensorInfo& t : m->tensors) {
      s.max_error_bound = std::max(s.max_error_bound, t.error_bound);
    }
    s.tensor_bytes += m->tensor_bytes();
    s.file_bytes += m->shard_bytes();
    s.tensor_count += m->tensors.size();
    s.shard_count += m->shards.size();
  }
  for (const std::string& name : manifests) {
    auto mstat = fs.Stat(internal::JoinPath(s.dir, name));
    if (mstat.ok()) s.file_bytes += mstat->size;
  }
  return s;
}

}  // namespace

absl::StatusOr<std::vector<CheckpointSummary>> ListCheckpoints(const std::string& root,
                                                               std::shared_ptr<FileSystem> fs) {
  if (fs == nullptr) {
    CKPT_ASSIGN_OR_RETURN(fs, FileSystemForRoot(root));
  }
  CKPT_ASSIGN_OR_RETURN(std::vector<int64_t> steps, ListSteps(root, fs));
  std::vector<CheckpointSummary> summaries;
  for (int64_t step : steps) summaries.push_back(Summarize(*fs, root, step));
  return summaries;
}

namespace {

absl::StatusOr<CheckpointSummary> SummarizeStep(const std::string& root, int64_t step,
                                                std::shared_ptr<FileSystem> fs, std::optional<int> only_rank) {
  if (fs == nullptr) {
    CKPT_ASSIGN_OR_RETURN(fs, FileSystemForRoot(root));
  }
  if (step < 0) {
    // No checkpoint has a negative step ("step--…" is not a checkpoint name).
    return absl::NotFoundError(absl::StrCat("no checkpoint has step ", step, " (steps are >= 0)"));
  }
  const std::string dir = internal::JoinPath(root, internal::CheckpointDirName(step));
  auto stat = fs->Stat(dir);
  if (!stat.ok()) return stat.status();
  if (!stat->is_directory) {
    return absl::NotFoundError(absl::StrCat(dir, " is not a checkpoint directory"));
  }
  return Summarize(*fs, root, step, only_rank);
}

}  // namespace

absl::StatusOr<CheckpointSummary> SummarizeCheckpoint(const std::string& root, int64_t step,
                                                      std::shared_ptr<FileSystem> fs) {
  return SummarizeStep(root, step, std::move(fs), std::nullopt);
}

namespace internal {

absl::StatusOr<CheckpointSummary> SummarizeRankCopy(const std::string& root, int64_t step,
                                                    std::shared_ptr<FileSystem> fs, int rank) {
  return SummarizeStep(root, step, std::move(fs), rank);
}

}  // namespace internal

absl::StatusOr<std::optional<int>> RankCopyOf(const std::string& root, std::shared_ptr<FileSystem> fs) {
  if (fs == nullptr) {
    CKPT_ASSIGN_OR_RETURN(fs, FileSystemForRoot(root));
  }
  CKPT_ASSIGN_OR_RETURN(std::vector<int64_t> steps, ListSteps(root, fs));
  if (steps.empty()) return std::nullopt;
  const std::string dir = internal::JoinPath(root, internal::CheckpointDirName(steps.back()));
  CKPT_ASSIGN_OR_RETURN(std::vector<std::string> names, fs->ListDir(dir));
  // The files of exactly one rank, its manifest among them: a whole
  // checkpoint that lost a rank's manifest still has that rank's shards.
  std::optional<int> only;
  bool has_manifest = false;
  for (const std::string& name : names) {
    absl::string_view digits = name;
    int rank = 0;
    if (!absl::ConsumePrefix(&digits, "rank-") || digits.size() < 6 || digits[5] != '.' ||
        !absl::SimpleAtoi(digits.substr(0, 5), &rank)) {
      continue;
    }
    if (only.has_value() && *only != rank) return std::nullopt;
    only = rank;
    has_manifest = has_manifest || name == internal::RankManifestName(rank);
  }
  if (!only.has_value() || !has_manifest) return std::nullopt;
  auto loaded = internal::LoadStepManifest(*fs, dir, steps.back(), only);
  if (!loaded.ok() || !loaded->multi_rank || loaded->global.world_size < 2) return std::nullopt;
  return only;
}

std::string DescribeRankCopy(const std::string& root, int rank) {
  return absl::StrCat(root, " is rank ", rank,
                      "'s own copy of checkpoints saved by ranks that share no file system: each step there "
                      "holds the checkpoint's manifest and this rank's part only, and the checkpoint is whole "
                      "only in the bucket the ranks uploaded it to");
}

absl::StatusOr<std::optional<int64_t>> ReadLatestHint(const std::string& root,
                                                      std::shared_ptr<FileSystem> fs) {
  if (fs == nullptr) {
    CKPT_ASSIGN_OR_RETURN(fs, FileSystemForRoot(root));
  }
  auto contents = internal::ReadSmallFile(*fs, internal::JoinPath(root, internal::kLatestName), 4096);
  if (!contents.ok()) {
    if (contents.status().code() == absl::StatusCode::kNotFound) return std::nullopt;
    return contents.status();
  }
  absl::string_view trimmed = absl::StripAsciiWhitespace(*contents);
  return internal::ParseCheckpointDirName(absl::string_view(trimmed.data(), trimmed.size()));
}

}  // namespace ckpt
