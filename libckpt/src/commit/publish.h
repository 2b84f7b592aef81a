// Publishing a directory (or a file) in a parent directory and taking it
// back: the renames and directory fsyncs that make a complete directory
// visible, replace one, or put one out of sight, in the commit order
// (fsync what is inside, rename, fsync the parent). Saves (commit.h),
// compaction, copies to another tier, removals and exports all move
// checkpoint directories through here, so the order lives in one place --
// and a storage backend without POSIX renames has one place to differ.
#ifndef CKPT_COMMIT_PUBLISH_H_
#define CKPT_COMMIT_PUBLISH_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ckpt/file_system.h"

namespace ckpt::internal {

// ROOT/.compact-old-<name>-<nonce>: a directory `ReplaceDir`'s two-rename
// fallback set aside; see `RecoverInterruptedReplaces`. (The name predates
// the move of replace from compact/; crashed replaces of old versions are
// recovered too.)
inline constexpr absl::string_view kReplaceAsidePrefix = ".compact-old-";

// Makes the entries of `dir`, a directory still being written, durable
// (fsync), before anything is decided on the strength of them.
absl::Status SyncTempDir(FileSystem& fs, const std::string& dir);

// Makes `temp` (in `parent`, its files written, fsynced and closed) visible
// as `parent`/`name`, which must not exist: fsyncs `temp`, renames it
// (never replacing), fsyncs `parent`. On error nothing is left under
// `name` (a rename whose parent fsync failed might not survive a power
// loss: it is taken back out of sight and removed); `temp`, if it still
// exists, is the caller's to remove.
absl::Status PublishDir(FileSystem& fs, const std::string& parent, const std::string& temp,
                        const std::string& name);

// Takes `dir` (in `parent`) out of sight: renames it to a fresh trash name
// in `parent` (from `name`) and fsyncs `parent`. Returns the trash path,
// whose removal only frees space. On error `dir` may still be visible.
absl::StatusOr<std::string> UnpublishDir(FileSystem& fs, const std::string& parent,
                                         const std::string& dir, absl::string_view name);

// `UnpublishDir`, then removes the trash; best effort: what is left is
// logged (readers ignore trash; ckpt-retain removes it later).
void DiscardDir(FileSystem& fs, const std::string& parent, const std::string& dir,
                absl::string_view name);

// Replaces `root`/`name` with `temp` (in `root`, its files written, fsynced
// and closed): fsyncs `temp`, then RENAME_EXCHANGE where the file system has
// it, else two renames with the old directory set aside meanwhile (see
// `RecoverInterruptedReplaces`); fsyncs `root`; discards the old directory.
// Sets `*how` to "exchange" or "rename". On error `root`/`name` holds the
// old directory again as far as possible, and `temp` (if it still exists)
// is the caller's to remove.
absl::Status ReplaceDir(FileSystem& fs, const std::string& root, const std::string& name,
                        const std::string& temp, std::string* how);

// Finishes what a crash between `ReplaceDir`'s two renames left in `root`:
// an aside directory whose name is taken again is removed; one whose name is
// absent is put back. Returns the first error; goes on past it.
absl::Status RecoverInterruptedReplaces(FileSystem& fs, const std::string& root);

// Makes the file `temp` (written, fsynced and closed) visible as `path`
// (in the same directory), which must not exist: renames it, fsyncs the
// directory. On error nothing is left at `path` and `temp` is removed.
absl::Status PublishFile(FileSystem& fs, const std::string& temp, const std::string& path);

}  // namespace ckpt::internal

#endif  // CKPT_COMMIT_PUBLISH_H_
