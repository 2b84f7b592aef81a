// ckpt/maintenance.h: what a checkpoint root holds besides checkpoints, and
// the operations maintenance tools (ckpt-retain, cold tiers) apply to whole
// checkpoint directories: remove one, copy one to another root.
//
// Every call goes through a `FileSystem` (null means `PosixFileSystem()`), so
// errors keep their meaning (ENOSPC is kResourceExhausted, EIO kInternal, a
// missing file kNotFound, each naming the path) and tests inject faults.
// Nothing here follows a symbolic link: a link inside a checkpoint directory
// is removed as a link and refused by a copy.
#ifndef CKPT_MAINTENANCE_H_
#define CKPT_MAINTENANCE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ckpt/file_system.h"

namespace ckpt {

// What an entry of a checkpoint root is, from its name alone.
enum class RootEntryKind : uint8_t {
  kCheckpoint,    // step-<20 digits>: a committed checkpoint
  kSaveTemp,      // .tmp-step-*: a save being written (or abandoned by a dead writer)
  kCompactTemp,   // .tmp-compact-*: a compaction being written
  kCopyTemp,      // .tmp-copy-*: a `CopyCheckpoint` into this root being written
  kOtherTemp,     // any other .tmp-* (older versions' copies)
  kTrash,         // .trash-*: a checkpoint being removed; invisible to readers
  kCompactAside,  // .compact-old-*: a delta set aside by a two-rename compaction
  kDirectProbe,   // .ckpt-direct-probe-*: the engine's O_DIRECT probe file
  kLatest,        // LATEST and its temp file
  kLock,          // .ckpt-writer.lock, .ckpt-retain.lock
  kUnknown,       // anything else: never touched
};

RootEntryKind ClassifyRootEntry(absl::string_view name);
// "checkpoint", "save-temp", ... (for logs and tool output).
absl::string_view RootEntryKindName(RootEntryKind kind);

// Removes `path` and, if it is a directory, everything below it, deepest
// first. Symbolic links are removed, never followed. kNotFound if `path`
// does not exist; otherwise the first error met (the removal stops there).
absl::Status RemoveTree(FileSystem& fs, const std::string& path);

// Removes checkpoint `step` from `root`: its directory is renamed to a
// `.trash-` name and `root` fsynced -- from then on the checkpoint is gone
// for every reader, whatever happens next -- then deleted. A failure before
// the rename leaves the checkpoint as it was; one after it leaves a trash
// directory, which readers ignore and `ckpt-retain` removes. kNotFound if
// there is no such checkpoint.
absl::Status RemoveCheckpoint(const std::string& root, int64_t step,
                              std::shared_ptr<FileSystem> fs = nullptr);

struct CopyStats {
  size_t files = 0;
  uint64_t bytes = 0;
};

// Copies checkpoint `step` of `root` into `target_root` under the same name,
// durably: every file is written into `target_root/.tmp-copy-...`, fsynced,
// read back (its cache dropped first, where the file system allows) and
// compared by XXH3 with what was read from the source, then the directory is
// fsynced, renamed into place (never over an existing checkpoint:
// kAlreadyExists) and `target_root` fsynced. The copy is either complete
// and verified under its final name or absent; on failure the temp directory
// is removed as far as possible (what remains is a `.tmp-` directory that
// readers ignore). The source must hold only regular files (anything else is
// kFailedPrecondition naming it). Byte-for-byte: deltas stay deltas, so the
// target root must also hold their bases to restore them.
absl::StatusOr<CopyStats> CopyCheckpoint(const std::string& root, int64_t step,
                                         const std::string& target_root,
                                         std::shared_ptr<FileSystem> fs = nullptr);

}  // namespace ckpt

#endif  // CKPT_MAINTENANCE_H_
