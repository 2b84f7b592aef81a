#include "compact/swap.h"

#include "absl/strings/str_cat.h"
#include "ckpt/compact.h"
#include "format/names.h"
#include "read/load_manifest.h"
#include "util/hash.h"
#include "util/status_macros.h"

namespace ckpt::internal {

absl::Status SwapIntoPlace(FileSystem& fs, const std::string& root,
                           const std::string& name, const std::string& temp,
                           uint64_t expected_hash, std::string* how) {
  const std::string dir = JoinPath(root, name);
  auto step = ParseCheckpointDirName(name);
  if (!step.has_value()) return absl::InvalidArgumentError(absl::StrCat(name, " is not a checkpoint name"));
  // Last check that the directory is still the one that was read.
  CKPT_ASSIGN_OR_RETURN(Manifest current, LoadManifest(fs, dir, *step));
  if (current.manifest_xxh3 != expected_hash) {
    return absl::AbortedError(absl::StrCat(dir, " changed while it was being compacted (manifest ",
                                           HashToHex(current.manifest_xxh3), ", read ",
                                           HashToHex(expected_hash), ")"));
  }
  return ReplaceDir(fs, root, name, temp, how);
}

absl::Status CommitInto(FileSystem& fs, const std::string& target, const std::string& name,
                        const std::string& temp) {
  return PublishDir(fs, target, temp, name);
}

}  // namespace ckpt::internal

namespace ckpt {

absl::Status FinishInterruptedCompactions(const std::string& root, std::shared_ptr<FileSystem> fs) {
  if (fs == nullptr) fs = PosixFileSystem();
  return internal::RecoverInterruptedReplaces(*fs, root);
}

}  // namespace ckpt
