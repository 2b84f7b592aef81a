#include "commit/publish.h"

#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "format/names.h"
#include "io/small_file.h"
#include "util/log.h"
#include "util/status_macros.h"

namespace ckpt::internal {
namespace {

// The two-rename fallback where RENAME_EXCHANGE is unsupported. Between the
// renames ROOT/`name` is absent; the aside name lets
// `RecoverInterruptedReplaces` repair a crash there.
absl::Status ReplaceByRenames(FileSystem& fs, const std::string& root, const std::string& name,
                              const std::string& temp, std::string* aside) {
  const std::string dir = JoinPath(root, name);
  *aside = JoinPath(root, UniqueName(kReplaceAsidePrefix, name));
  CKPT_RETURN_IF_ERROR(fs.Rename(dir, *aside, RenameMode::kNoReplace));
  absl::Status s = fs.Rename(temp, dir, RenameMode::kNoReplace);
  if (s.ok()) s = fs.SyncDir(root);
  if (s.ok()) return s;
  // Put the old directory back. If that fails too, the aside directory
  // remains for `RecoverInterruptedReplaces`.
  if (fs.Stat(dir).ok()) (void)fs.Rename(dir, temp, RenameMode::kNoReplace);
  if (fs.Rename(*aside, dir, RenameMode::kNoReplace).ok()) (void)fs.SyncDir(root);
  return s;
}

std::string DirOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

absl::Status SyncTempDir(FileSystem& fs, const std::string& dir) { return fs.SyncDir(dir); }

absl::Status PublishDir(FileSystem& fs, const std::string& parent, const std::string& temp,
                        const std::string& name) {
  CKPT_RETURN_IF_ERROR(fs.SyncDir(temp));
  const std::string final_dir = JoinPath(parent, name);
  CKPT_RETURN_IF_ERROR(fs.Rename(temp, final_dir, RenameMode::kNoReplace));
  absl::Status s = fs.SyncDir(parent);
  if (!s.ok()) DiscardDir(fs, parent, final_dir, name);
  return s;
}

absl::StatusOr<std::string> UnpublishDir(FileSystem& fs, const std::string& parent,
                                         const std::string& dir, absl::string_view name) {
  const std::string trash = JoinPath(parent, UniqueName(kTrashPrefix, name));
  CKPT_RETURN_IF_ERROR(fs.Rename(dir, trash, RenameMode::kNoReplace));
  CKPT_RETURN_IF_ERROR(fs.SyncDir(parent));
  return trash;
}

void DiscardDir(FileSystem& fs, const std::string& parent, const std::string& dir,
                absl::string_view name) {
  const std::string trash = JoinPath(parent, UniqueName(kTrashPrefix, name));
  absl::Status s = fs.Rename(dir, trash, RenameMode::kNoReplace);
  if (!s.ok()) {
    Log(LogLevel::kWarning, absl::StrCat("could not remove ", dir, " (", s.message(),
                                         "); readers ignore it, ckpt-retain removes it later"));
    return;
  }
  s = fs.SyncDir(parent);
  if (!s.ok()) Log(LogLevel::kWarning, absl::StrCat("after moving ", dir, " to ", trash, ": ", s.message()));
  RemoveTreeBestEffort(fs, trash);
}

absl::Status ReplaceDir(FileSystem& fs, const std::string& root, const std::string& name,
                        const std::string& temp, std::string* how) {
  CKPT_RETURN_IF_ERROR(fs.SyncDir(temp));
  const std::string dir = JoinPath(root, name);
  std::string old_dir;
  absl::Status s = fs.Exchange(temp, dir);
  if (s.ok()) {
    *how = "exchange";
    old_dir = temp;  // now holds the old directory
    s = fs.SyncDir(root);
    if (!s.ok()) {
      // Not known to be durable: swap back (either state is a valid one).
      if (fs.Exchange(temp, dir).ok()) (void)fs.SyncDir(root);
      return s;
    }
  } else if (s.code() == absl::StatusCode::kUnimplemented) {
    Log(LogLevel::kInfo, absl::StrCat(s.message(), "; replacing ", name, " with two renames"));
    *how = "rename";
    CKPT_RETURN_IF_ERROR(ReplaceByRenames(fs, root, name, temp, &old_dir));
  } else {
    return s;
  }
  DiscardDir(fs, root, old_dir, name);
  return absl::OkStatus();
}

absl::Status RecoverInterruptedReplaces(FileSystem& fs, const std::string& root) {
  CKPT_ASSIGN_OR_RETURN(std::vector<std::string> names, fs.ListDir(root));
  absl::Status first;
  auto note = [&first](const absl::Status& s) {
    if (first.ok() && !s.ok()) first = s;
  };
  for (const std::string& entry : names) {
    if (!absl::StartsWith(entry, kReplaceAsidePrefix)) continue;
    // ".compact-old-step-<20 digits>-<16 hex>"
    absl::string_view rest = absl::string_view(entry).substr(kReplaceAsidePrefix.size());
    const size_t dash = rest.rfind('-');
    if (dash == absl::string_view::npos) continue;
    const absl::string_view name = rest.substr(0, dash);
    if (!ParseCheckpointDirName(name).has_value()) continue;
    const std::string aside = JoinPath(root, entry);
    const std::string dir = JoinPath(root, name);
    if (fs.Stat(dir).ok()) {
      Log(LogLevel::kInfo, absl::StrCat("removing ", aside, ": its replacement completed"));
      DiscardDir(fs, root, aside, name);
      continue;
    }
    Log(LogLevel::kWarning, absl::StrCat("putting back ", dir, " from ", aside,
                                         " (a replacement was interrupted)"));
    absl::Status s = fs.Rename(aside, dir, RenameMode::kNoReplace);
    if (s.ok()) s = fs.SyncDir(root);
    note(s);
  }
  return first;
}

absl::Status PublishFile(FileSystem& fs, const std::string& temp, const std::string& path) {
  absl::Status status = fs.Rename(temp, path, RenameMode::kNoReplace);
  if (!status.ok()) {
    (void)fs.RemoveFile(temp);
    return status;
  }
  if (absl::Status synced = fs.SyncDir(DirOf(path)); !synced.ok()) {
    // Its name might not survive a power loss: take it back, so that an
    // error always means nothing was left (the caller can simply retry).
    (void)fs.RemoveFile(path);
    return synced;
  }
  return absl::OkStatus();
}

}  // namespace ckpt::internal
