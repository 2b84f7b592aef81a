#include "commit/commit.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "commit/publish.h"
#include "format/names.h"
#include "io/small_file.h"
#include "util/kill_point.h"
#include "util/status_macros.h"

namespace ckpt::internal {
namespace {

// Writes `contents` to a fresh temp file and renames it over ROOT/LATEST.
absl::Status WriteLatest(FileSystem& fs, const std::string& root, const std::string& contents) {
  const std::string temp =
      JoinPath(root, UniqueName(absl::StrCat(".", kLatestName, ".tmp"), ""));
  absl::Status s = WriteFileDurably(fs, temp, contents);
  if (s.ok()) s = fs.Rename(temp, JoinPath(root, kLatestName), RenameMode::kReplace);
  if (!s.ok()) (void)fs.RemoveFile(temp);
  return s;
}

}  // namespace

absl::Status CommitCheckpoint(FileSystem& fs, const std::string& root,
                              const std::string& temp_dir, const std::string& final_name) {
  CKPT_RETURN_IF_ERROR(fs.SyncDir(temp_dir));
  KillPoint("commit.dir_synced");
  const std::string final_dir = JoinPath(root, final_name);
  CKPT_RETURN_IF_ERROR(fs.Rename(temp_dir, final_dir, RenameMode::kNoReplace));
  KillPoint("commit.renamed");
  absl::Status s = fs.SyncDir(root);
  if (s.ok()) KillPoint("commit.root_synced");
  // LATEST as it was, to put back if the rest fails (absent: nullopt).
  std::optional<std::string> previous_latest;
  bool latest_replaced = false;
  if (s.ok()) {
    auto previous = ReadSmallFile(fs, JoinPath(root, kLatestName), 4096);
    if (previous.ok()) {
      previous_latest = *previous;
    } else if (previous.status().code() != absl::StatusCode::kNotFound) {
      s = previous.status();
    }
  }
  if (s.ok()) {
    s = WriteLatest(fs, root, absl::StrCat(final_name, "\n"));
    latest_replaced = s.ok();
    if (s.ok()) KillPoint("commit.latest");
  }
  if (s.ok()) s = fs.SyncDir(root);
  if (s.ok()) return s;
  // Poisoned after it became visible: point LATEST back where it was, then
  // take the checkpoint out of sight. Best effort: the first error stands.
  if (latest_replaced) {
    if (previous_latest.has_value()) {
      (void)WriteLatest(fs, root, *previous_latest);
    } else {
      (void)fs.RemoveFile(JoinPath(root, kLatestName));
    }
  }
  DiscardDir(fs, root, final_dir, final_name);
  return s;
}

}  // namespace ckpt::internal
