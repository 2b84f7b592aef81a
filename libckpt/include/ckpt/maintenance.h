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
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
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


// The bytes of the files under `path` (a file: its size; a directory: the
// sum over its tree). Symbolic links count 0 and are never followed. The
// first error met; kNotFound if `path` does not exist.
absl::StatusOr<uint64_t> TreeBytes(FileSystem& fs, const std::string& path);

// "512 B", "1.5 KiB", "612.0 MiB", "3.2 TiB": a size for log lines.
std::string HumanBytes(uint64_t bytes);

// Which orphans of a root `ReclaimOrphans` may remove: those the caller has
// proven dead by holding the root's locks (ckpt/root_lock.h).
struct ReclaimScope {
  // `.tmp-step-*`, saves in progress. REQUIRES: the caller holds ROOT's
  // writer lock (every save in progress is then the caller's own, and it
  // has none yet), or has held it since it last saw no writer alive.
  bool save_temps = false;
  // `.trash-*`, `.tmp-compact-*`, `.tmp-copy-*`, other `.tmp-*` and
  // `.ckpt-direct-probe-*`; and `.compact-old-*`, which are not removed but
  // handed to `FinishInterruptedCompactions` (ckpt/compact.h), which puts
  // the checkpoint back or completes the compaction. REQUIRES: the caller
  // holds ROOT's retention lock, under which every compaction and copy into
  // ROOT runs.
  bool job_debris = false;
  // With `job_debris`: a probe file untouched for less than this stays (an
  // engine opening ROOT writes one and removes it within moments, holding
  // only the writer lock). Zero when the caller also holds the writer lock.
  absl::Duration probe_min_age = absl::Minutes(1);
  // List what would be removed, with sizes; change nothing.
  bool dry_run = false;
};

// One orphan `ReclaimOrphans` met.
struct ReclaimedEntry {
  std::string name;  // entry of ROOT
  RootEntryKind kind = RootEntryKind::kUnknown;
  uint64_t bytes = 0;  // its files' sizes, measured before removal
  absl::Status status;  // OK: removed (in a dry run: would be); else why it stays
};

struct ReclaimStats {
  size_t removed = 0;   // entries removed (in a dry run: that would be)
  uint64_t bytes = 0;   // their bytes
  size_t failed = 0;    // entries that could not be removed (each logged)
  // Interrupted compactions handed to `FinishInterruptedCompactions`.
  size_t compactions_finished = 0;
  std::vector<ReclaimedEntry> entries;  // every orphan in scope, by name
  // The names of the entries removed.
  std::vector<std::string> removed_names() const;
};

// Removes the orphans of `root` that `scope` covers (never a checkpoint,
// LATEST, a lock file or an entry `ClassifyRootEntry` calls kUnknown; never
// following a symbolic link). Each removal is logged at info with its size
// and what left it ("removed /r/.tmp-step-…-ab12 (612.0 MiB), a save its
// writer did not finish"); an entry that cannot be removed, or an
// interrupted compaction that cannot be finished, is logged as a warning and
// counted in `failed`, and the sweep goes on: readers ignore orphans, so
// none of that is an error. Errors: only listing `root` (as the caller's
// next step would fail too).
absl::StatusOr<ReclaimStats> ReclaimOrphans(const std::string& root, const ReclaimScope& scope,
                                            std::shared_ptr<FileSystem> fs = nullptr);

// A save temp moved out of the way by `TrashSaveTemps`.
struct TrashedSaveTemp {
  std::string name;   // the `.tmp-step-*` it was
  std::string trash;  // the `.trash-*` it is now
};

// Renames every `.tmp-step-*` of `root` to a fresh `.trash-` name and
// fsyncs `root`: renames only (nothing is measured or deleted), so that a
// caller holding the writer lock just for this keeps it for moments; the trash is then `job_debris` for
// `ReclaimOrphans`. A temp that cannot be renamed is logged and stays.
// Errors: listing or fsyncing `root`. REQUIRES: the caller holds `root`'s
// writer lock.
absl::StatusOr<std::vector<TrashedSaveTemp>> TrashSaveTemps(const std::string& root,
                                                            std::shared_ptr<FileSystem> fs = nullptr);

}  // namespace ckpt

#endif  // CKPT_MAINTENANCE_H_
