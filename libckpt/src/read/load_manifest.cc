#include "read/load_manifest.h"

#include "absl/strings/str_cat.h"
#include "format/names.h"
#include "io/small_file.h"
#include "util/hash.h"
#include "util/status_macros.h"

namespace ckpt::internal {

namespace {

// `dir`/`name`'s contents; kDataLoss if it is missing or not a regular file.
absl::StatusOr<std::string> ReadManifestFile(FileSystem& fs, const std::string& dir,
                                             absl::string_view name) {
  // A step directory that is a symlink could point anywhere (another root,
  // another user's files): never read through one.
  auto dir_stat = fs.Stat(dir);
  if (!dir_stat.ok() && dir_stat.status().code() != absl::StatusCode::kNotFound) {
    return dir_stat.status();  // a missing one is reported below, as its manifest
  }
  if (dir_stat.ok() && dir_stat->is_symlink) {
    return absl::DataLossError(
        absl::StrCat("checkpoint directory ", dir, " is a symbolic link, not a directory (refused)"));
  }
  const std::string path = JoinPath(dir, name);
  auto contents = ReadSmallFile(fs, path, kMaxManifestBytes);
  if (!contents.ok()) {
    if (contents.status().code() == absl::StatusCode::kNotFound) {
      return absl::DataLossError(absl::StrCat("manifest ", path, " is missing"));
    }
    if (contents.status().code() == absl::StatusCode::kFailedPrecondition) {  // a FIFO, a symlink...
      return absl::DataLossError(absl::StrCat("manifest ", contents.status().message()));
    }
    return contents.status();
  }
  return contents;
}

// Every shard `manifest` lists exists in `dir` with exactly its size.
absl::Status CheckShards(FileSystem& fs, const std::string& dir, const Manifest& manifest) {
  for (const ShardInfo& shard : manifest.shards) {
    const std::string shard_path = JoinPath(dir, shard.file);
    auto stat = fs.Stat(shard_path);
    if (!stat.ok()) {
      if (stat.status().code() == absl::StatusCode::kNotFound) {
        return absl::DataLossError(absl::StrCat("shard ", shard_path, " is missing"));
      }
      return stat.status();
    }
    if (stat->is_symlink || stat->is_directory) {
      return absl::DataLossError(absl::StrCat("shard ", shard_path, " is ",
                                              stat->is_symlink ? "a symbolic link" : "a directory",
                                              ", not a regular file (refused)"));
    }
    if (stat->size != shard.bytes) {
      return absl::DataLossError(absl::StrCat("shard ", shard_path, " is ", stat->size,
                                              " bytes but the manifest says ", shard.bytes,
                                              stat->size < shard.bytes ? " (truncated)" : ""));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Manifest> ParseAndCheck(FileSystem& fs, const std::string& dir, absl::string_view name,
                                       absl::string_view contents, int64_t expected_step) {
  const std::string path = JoinPath(dir, name);
  if (IsGlobalManifest(contents)) {
    return absl::UnimplementedError(absl::StrCat(
        path, " is the manifest of a multi-rank checkpoint, not of one process's"));
  }
  CKPT_ASSIGN_OR_RETURN(Manifest manifest, ParseManifest(contents, path));
  if (manifest.step != expected_step) {
    return absl::DataLossError(absl::StrCat("manifest ", path, " is for step ", manifest.step,
                                            ", not ", expected_step));
  }
  CKPT_RETURN_IF_ERROR(CheckShards(fs, dir, manifest));
  return manifest;
}

}  // namespace

absl::StatusOr<Manifest> LoadManifest(FileSystem& fs, const std::string& dir,
                                      int64_t expected_step, absl::string_view name) {
  CKPT_ASSIGN_OR_RETURN(std::string contents, ReadManifestFile(fs, dir, name));
  return ParseAndCheck(fs, dir, name, contents, expected_step);
}

namespace {

// `dir`'s step manifest as a multi-rank one, for `expected_step`.
absl::StatusOr<GlobalManifest> LoadGlobalManifest(FileSystem& fs, const std::string& dir,
                                                  absl::string_view contents, int64_t expected_step) {
  const std::string path = JoinPath(dir, kManifestName);
  CKPT_ASSIGN_OR_RETURN(GlobalManifest global, ParseGlobalManifest(contents, path));
  if (global.step != expected_step) {
    return absl::DataLossError(absl::StrCat("manifest ", path, " is for step ", global.step,
                                            ", not ", expected_step));
  }
  return global;
}

// Rank `part.rank`'s manifest in `dir`, checked against `part`.
absl::StatusOr<Manifest> LoadListedPart(FileSystem& fs, const std::string& dir, int64_t step,
                                        const RankPart& part) {
  auto m = LoadManifest(fs, dir, step, part.manifest);
  if (!m.ok()) {
    if (m.status().code() != absl::StatusCode::kDataLoss) return m.status();
    return absl::DataLossError(absl::StrCat("rank ", part.rank, "'s part of ", dir, ": ",
                                            m.status().message()));
  }
  if (m->manifest_xxh3 != part.manifest_xxh3) {
    return absl::DataLossError(absl::StrCat("manifest ", JoinPath(dir, part.manifest),
                                            " is not the one ", JoinPath(dir, kManifestName),
                                            " lists (checksum ", HashToHex(m->manifest_xxh3),
                                            ", expected ", HashToHex(part.manifest_xxh3), ")"));
  }
  return m;
}

}  // namespace

absl::StatusOr<Manifest> LoadRankPart(FileSystem& fs, const std::string& dir, int64_t expected_step,
                                      int rank) {
  CKPT_ASSIGN_OR_RETURN(std::string contents, ReadManifestFile(fs, dir, kManifestName));
  if (!IsGlobalManifest(contents)) {
    return absl::DataLossError(absl::StrCat("checkpoint ", dir,
                                            " is not a multi-rank checkpoint, so it has no rank ",
                                            rank, "'s part"));
  }
  CKPT_ASSIGN_OR_RETURN(GlobalManifest global, LoadGlobalManifest(fs, dir, contents, expected_step));
  if (rank < 0 || rank >= global.world_size) {
    return absl::DataLossError(absl::StrCat("checkpoint ", dir, " has ranks 0..", global.world_size - 1,
                                            ", not rank ", rank));
  }
  return LoadListedPart(fs, dir, expected_step, global.ranks[rank]);
}

absl::StatusOr<StepManifest> LoadStepManifest(FileSystem& fs, const std::string& dir,
                                              int64_t expected_step, std::optional<int> only_rank) {
  CKPT_ASSIGN_OR_RETURN(std::string contents, ReadManifestFile(fs, dir, kManifestName));
  StepManifest step;
  if (!IsGlobalManifest(contents)) {
    CKPT_ASSIGN_OR_RETURN(step.single, ParseAndCheck(fs, dir, kManifestName, contents, expected_step));
    return step;
  }
  step.multi_rank = true;
  CKPT_ASSIGN_OR_RETURN(step.global, LoadGlobalManifest(fs, dir, contents, expected_step));
  step.parts.reserve(step.global.ranks.size());
  if (only_rank.has_value() && (*only_rank < 0 || *only_rank >= step.global.world_size)) {
    return absl::DataLossError(absl::StrCat("checkpoint ", dir, " has ranks 0..", step.global.world_size - 1,
                                            ", not rank ", *only_rank));
  }
  for (const RankPart& part : step.global.ranks) {
    if (only_rank.has_value() && part.rank != *only_rank) {
      step.parts.emplace_back();  // not loaded
      continue;
    }
    CKPT_ASSIGN_OR_RETURN(Manifest m, LoadListedPart(fs, dir, expected_step, part));
    step.parts.push_back(std::move(m));
  }
  return step;
}

}  // namespace ckpt::internal
