#include "read/load_manifest.h"

#include "absl/strings/str_cat.h"
#include "format/names.h"
#include "io/small_file.h"
#include "util/status_macros.h"

namespace ckpt::internal {

absl::StatusOr<Manifest> LoadManifest(FileSystem& fs, IoQueue& queue, const std::string& dir,
                                      int64_t expected_step) {
  const std::string path = JoinPath(dir, kManifestName);
  auto contents = ReadSmallFile(fs, queue, path, kMaxManifestBytes);
  if (!contents.ok()) {
    if (contents.status().code() == absl::StatusCode::kNotFound) {
      return absl::DataLossError(absl::StrCat("manifest ", path, " is missing"));
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
    if (stat->size != shard.bytes) {
      return absl::DataLossError(absl::StrCat("shard ", shard_path, " is ", stat->size,
                                              " bytes but the manifest says ", shard.bytes,
                                              stat->size < shard.bytes ? " (truncated)" : ""));
    }
  }
  return manifest;
}

}  // namespace ckpt::internal
