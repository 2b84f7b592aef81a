#include "compact/swap.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "ckpt/compact.h"
#include "format/names.h"
#include "io/small_file.h"
#include "read/load_manifest.h"
#include "util/hash.h"
#include "util/log.h"
#include "util/status_macros.h"

namespace ckpt::internal {
namespace {

// Takes `dir` (a checkpoint directory out of readers' sight, or one to take
// out of it) away: renames it to a trash name, fsyncs `root`, removes it.
// Best effort: what is left is logged.
void DiscardDir(FileSystem& fs, const std::string& root, const std::string& dir,
                absl::string_view name) {
  const std::string trash = JoinPath(root, UniqueName(kTrashPrefix, name));
  absl::Status s = fs.Rename(dir, trash, RenameMode::kNoReplace);
  if (!s.ok()) {
    Log(LogLevel::kWarning, absl::StrCat("could not remove ", dir, " (", s.message(),
                                         "); readers ignore it, ckpt-retain removes it later"));
    return;
  }
  s = fs.SyncDir(root);
  if (!s.ok()) Log(LogLevel::kWarning, absl::StrCat("after moving ", dir, " to ", trash, ": ", s.message()));
  RemoveTreeBestEffort(fs, trash);
}

// The two-rename fallback where RENAME_EXCHANGE is unsupported. Between the
// renames ROOT/`name` is absent; the aside name lets
// `FinishInterruptedCompactions` repair a crash there.
absl::Status SwapByRenames(FileSystem& fs, const std::string& root, const std::string& name,
                           const std::string& temp, std::string* aside) {
  const std::string dir = JoinPath(root, name);
  *aside = JoinPath(root, UniqueName(kCompactAsidePrefix, name));
  CKPT_RETURN_IF_ERROR(fs.Rename(dir, *aside, RenameMode::kNoReplace));
  absl::Status s = fs.Rename(temp, dir, RenameMode::kNoReplace);
  if (s.ok()) s = fs.SyncDir(root);
  if (s.ok()) return s;
  // Put the delta back. If that fails too, the aside directory remains for
  // `FinishInterruptedCompactions`.
  if (fs.Stat(dir).ok()) (void)fs.Rename(dir, temp, RenameMode::kNoReplace);
  if (fs.Rename(*aside, dir, RenameMode::kNoReplace).ok()) (void)fs.SyncDir(root);
  return s;
}

}  // namespace

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
  std::string old_dir;
  absl::Status s = fs.Exchange(temp, dir);
  if (s.ok()) {
    *how = "exchange";
    old_dir = temp;  // now holds the delta
    s = fs.SyncDir(root);
    if (!s.ok()) {
      // Not known to be durable: swap back (either state is a valid step S).
      if (fs.Exchange(temp, dir).ok()) (void)fs.SyncDir(root);
      return s;
    }
  } else if (s.code() == absl::StatusCode::kUnimplemented) {
    Log(LogLevel::kInfo, absl::StrCat(s.message(), "; swapping ", name, " with two renames"));
    *how = "rename";
    CKPT_RETURN_IF_ERROR(SwapByRenames(fs, root, name, temp, &old_dir));
  } else {
    return s;
  }
  DiscardDir(fs, root, old_dir, name);
  return absl::OkStatus();
}

absl::Status CommitInto(FileSystem& fs, const std::string& target, const std::string& name,
                        const std::string& temp) {
  const std::string final_dir = JoinPath(target, name);
  CKPT_RETURN_IF_ERROR(fs.Rename(temp, final_dir, RenameMode::kNoReplace));
  absl::Status s = fs.SyncDir(target);
  if (!s.ok()) DiscardDir(fs, target, final_dir, name);
  return s;
}

}  // namespace ckpt::internal

namespace ckpt {

absl::Status FinishInterruptedCompactions(const std::string& root, std::shared_ptr<FileSystem> fs) {
  using namespace internal;  // NOLINT
  if (fs == nullptr) fs = PosixFileSystem();
  CKPT_ASSIGN_OR_RETURN(std::vector<std::string> names, fs->ListDir(root));
  absl::Status first;
  auto note = [&first](const absl::Status& s) {
    if (first.ok() && !s.ok()) first = s;
  };
  for (const std::string& entry : names) {
    if (!absl::StartsWith(entry, kCompactAsidePrefix)) continue;
    // ".compact-old-step-<20 digits>-<16 hex>"
    absl::string_view rest = absl::string_view(entry).substr(kCompactAsidePrefix.size());
    const size_t dash = rest.rfind('-');
    if (dash == absl::string_view::npos) continue;
    const absl::string_view name = rest.substr(0, dash);
    if (!ParseCheckpointDirName(name).has_value()) continue;
    const std::string aside = JoinPath(root, entry);
    const std::string dir = JoinPath(root, name);
    if (fs->Stat(dir).ok()) {
      Log(LogLevel::kInfo, absl::StrCat("removing ", aside, ": its compaction completed"));
      DiscardDir(*fs, root, aside, name);
      continue;
    }
    Log(LogLevel::kWarning, absl::StrCat("putting back ", dir, " from ", aside,
                                         " (a compaction was interrupted)"));
    absl::Status s = fs->Rename(aside, dir, RenameMode::kNoReplace);
    if (s.ok()) s = fs->SyncDir(root);
    note(s);
  }
  return first;
}

}  // namespace ckpt
