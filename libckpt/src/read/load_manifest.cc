#include "read/load_manifest.h"

#include "absl/strings/str_cat.h"
#include "format/names.h"
#include "io/small_file.h"
#include "util/status_macros.h"

namespace ckpt::internal {

absl::StatusOr<Manifest> LoadManifest(FileSystem& fs, const std::string& dir,
                                      int64_t expected_step) {
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
  const std::string path = JoinPath(dir, kManifestName);
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
  CKPT_ASSIGN_OR_RETURN(Manifest manifest, ParseManifest(*contents, path));
  if (manifest.step != expected_step) {
    return absl::DataLossError(absl::StrCat("manifest ", path, " is for step ", manifest.step,
                                            ", not ", expected_step));
  }
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
  return manifest;
}

}  // namespace ckpt::internal
