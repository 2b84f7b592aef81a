#include "ckpt/catalog.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "format/names.h"
#include "io/small_file.h"
#include "read/load_manifest.h"
#include "util/status_macros.h"

namespace ckpt {

std::string StepDirName(int64_t step) { return internal::CheckpointDirName(step); }

absl::StatusOr<std::vector<int64_t>> ListSteps(const std::string& root,
                                               std::shared_ptr<FileSystem> fs) {
  if (fs == nullptr) fs = PosixFileSystem();
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

CheckpointSummary Summarize(FileSystem& fs, const std::string& root, int64_t step) {
  CheckpointSummary s;
  s.step = step;
  s.dir = internal::JoinPath(root, internal::CheckpointDirName(step));
  auto manifest = internal::LoadManifest(fs, s.dir, step);
  if (!manifest.ok()) {
    s.manifest_status = manifest.status();
    return s;
  }
  s.kind = manifest->kind;
  s.base_step = manifest->base_step;
  s.delta_mode = manifest->delta_mode;
  for (const TensorInfo& t : manifest->tensors) {
    s.max_error_bound = std::max(s.max_error_bound, t.error_bound);
  }
  s.tensor_bytes = manifest->tensor_bytes();
  s.file_bytes = manifest->shard_bytes();
  auto mstat = fs.Stat(internal::JoinPath(s.dir, internal::kManifestName));
  if (mstat.ok()) s.file_bytes += mstat->size;
  s.tensor_count = manifest->tensors.size();
  s.shard_count = manifest->shards.size();
  s.created_unix_ns = manifest->created_unix_ns;
  s.manifest_xxh3 = manifest->manifest_xxh3;
  s.compacted = manifest->compacted;
  s.compacted_from_manifest_xxh3 = manifest->compacted_from_manifest_xxh3;
  return s;
}

}  // namespace

absl::StatusOr<std::vector<CheckpointSummary>> ListCheckpoints(const std::string& root,
                                                               std::shared_ptr<FileSystem> fs) {
  if (fs == nullptr) fs = PosixFileSystem();
  CKPT_ASSIGN_OR_RETURN(std::vector<int64_t> steps, ListSteps(root, fs));
  std::vector<CheckpointSummary> summaries;
  for (int64_t step : steps) summaries.push_back(Summarize(*fs, root, step));
  return summaries;
}

absl::StatusOr<CheckpointSummary> SummarizeCheckpoint(const std::string& root, int64_t step,
                                                      std::shared_ptr<FileSystem> fs) {
  if (fs == nullptr) fs = PosixFileSystem();
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
  return Summarize(*fs, root, step);
}

absl::StatusOr<std::optional<int64_t>> ReadLatestHint(const std::string& root,
                                                      std::shared_ptr<FileSystem> fs) {
  if (fs == nullptr) fs = PosixFileSystem();
  auto contents = internal::ReadSmallFile(*fs, internal::JoinPath(root, internal::kLatestName), 4096);
  if (!contents.ok()) {
    if (contents.status().code() == absl::StatusCode::kNotFound) return std::nullopt;
    return contents.status();
  }
  absl::string_view trimmed = absl::StripAsciiWhitespace(*contents);
  return internal::ParseCheckpointDirName(absl::string_view(trimmed.data(), trimmed.size()));
}

}  // namespace ckpt
