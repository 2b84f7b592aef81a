#include "commit/commit.h"

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "format/names.h"
#include "io/small_file.h"
#include "util/status_macros.h"

namespace ckpt::internal {
namespace {

uint64_t Nonce() {
  static absl::BitGen* gen = new absl::BitGen();  // thread-compatible use under engine lock
  return absl::Uniform<uint64_t>(*gen);
}

absl::Status ReplaceLatest(FileSystem& fs, IoQueue& queue, const std::string& root,
                           const std::string& final_name) {
  const std::string temp =
      JoinPath(root, absl::StrFormat(".%s.tmp-%016x", kLatestName, Nonce()));
  absl::Status s = WriteFileDurably(fs, queue, temp, absl::StrCat(final_name, "\n"));
  if (s.ok()) s = fs.Rename(temp, JoinPath(root, kLatestName), RenameMode::kReplace);
  if (!s.ok()) {
    (void)fs.RemoveFile(temp);
    return s;
  }
  return fs.SyncDir(root);
}

}  // namespace

absl::Status CommitCheckpoint(FileSystem& fs, IoQueue& queue, const std::string& root,
                              const std::string& temp_dir, const std::string& final_name) {
  CKPT_RETURN_IF_ERROR(fs.SyncDir(temp_dir));
  const std::string final_dir = JoinPath(root, final_name);
  CKPT_RETURN_IF_ERROR(fs.Rename(temp_dir, final_dir, RenameMode::kNoReplace));
  absl::Status s = fs.SyncDir(root);
  if (s.ok()) s = ReplaceLatest(fs, queue, root, final_name);
  if (s.ok()) return s;
  // Poisoned after it became visible: take it back out of sight first.
  const std::string trash =
      JoinPath(root, absl::StrFormat("%s%s-%016x", kTrashPrefix, final_name, Nonce()));
  if (fs.Rename(final_dir, trash, RenameMode::kNoReplace).ok()) {
    (void)fs.SyncDir(root);
    RemoveTreeBestEffort(fs, trash);
  }
  return s;
}

}  // namespace ckpt::internal
