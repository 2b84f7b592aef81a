// tools/retain/retention.h: the retention/tiering job behind `ckpt-retain`:
// which checkpoints of a root to keep, and moving or deleting the rest without
// ever breaking a delta chain or disturbing a writer. See docs/retention.md.
#ifndef CKPT_TOOLS_RETAIN_RETENTION_H_
#define CKPT_TOOLS_RETAIN_RETENTION_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ckpt/file_system.h"
#include "ckpt/object_store.h"
#include "ckpt/object_tier.h"

namespace ckpt::tools {

struct RetentionPolicy {
  int keep_last = 0;                               // the newest N steps
  int64_t keep_every = 0;                          // steps divisible by K
  absl::Duration keep_newer_than = absl::ZeroDuration();  // created within this
  // Move instead of delete: to a directory, or to a bucket prefix given as
  // `s3://bucket/prefix` (ckpt/object_tier.h: uploaded, read back, committed
  // by a marker; one job per prefix through a lease object).
  std::string cold_dir;
  // An s3:// `cold_dir`: requests in flight, part size of multipart uploads
  // (and of read-back GETs), bytes per second each upload stream may send
  // (0: unlimited), how long the lease is taken for, and the store to use
  // (null: `ckpt::OpenObjectStore(cold_dir, {})`; tests inject faults here;
  // with an s3:// root, the root's store).
  int upload_streams = PublishOptions{}.streams;
  uint64_t upload_part_bytes = PublishOptions{}.part_bytes;
  bool upload_read_back = PublishOptions{}.read_back;
  std::string upload_storage_class;  // `PublishOptions::storage_class`
  int64_t max_upload_bytes_per_second = 0;
  absl::Duration lease_duration = absl::Hours(6);
  // While another job holds the prefix's lease (another ckpt-retain, or a
  // training job's upload behind the save, which holds it for one step at
  // a time): how long to wait for it before failing with kUnavailable
  // (`ObjectLease::AcquireWaiting`; zero: fail at once).
  absl::Duration lease_wait = absl::ZeroDuration();
  std::shared_ptr<ObjectStore> cold_store;
  // A save in progress (`.tmp-step-*`) untouched for this long goes even
  // while a writer holds ROOT's lock (a writer hung that long). Every other
  // orphan goes whatever its age; see `RunRetention`.
  absl::Duration stale_temp_age = absl::Hours(1);
  // Rewrite a kept delta as a full checkpoint (`ckpt::CompactToFull`) when
  // that frees more bytes than it writes, so that its bases can go; and write
  // a delta moving to `cold_dir` whose base stays hot as a full checkpoint
  // there. With false, a kept delta keeps all its bases, and a delta whose
  // base stays hot stays hot too.
  bool compact = true;
  bool dry_run = false;
  // Every file-system call of the run goes through `fs` (null:
  // `ckpt::PosixFileSystem()`); tests inject faults through it.
  std::shared_ptr<FileSystem> fs;
};

struct RetentionAction {
  enum class Kind {
    kKeep,
    kCompact,      // kept, and rewritten in place as a full checkpoint
    kMove,         // copied to the cold dir as is, then removed
    kCompactMove,  // written to the cold dir as a full checkpoint, then removed
    kDelete,
    kRemoveStale,
    kSkipDamaged,
  };
  Kind kind;
  std::string name;    // entry in ROOT (a cold dir's orphan: its path)
  int64_t step = -1;   // -1 for stale entries
  std::string reason;  // why kept / removed
  bool done = false;   // carried out (false in a dry run or on failure)
  std::string error;
  uint64_t bytes = 0;  // kRemoveStale: the entry's size (its files' bytes)
};

const char* ActionName(RetentionAction::Kind kind);

// Plans (and unless `dry_run`, carries out) retention over `root`, holding
// an exclusive flock on ROOT/.ckpt-retain.lock meanwhile (a second job on the
// same root gets kUnavailable). Always kept: the newest step and the step
// ROOT/LATEST names, each with its whole delta chain (never compacted: a
// restore of it, or the writer, may be using it), and every step a rule
// keeps. A kept delta whose chain reaches steps no rule keeps is compacted
// (see `RetentionPolicy::compact`) or keeps those bases; no chain is ever
// broken, in ROOT or in the cold tier. Damaged checkpoints are left alone and
// reported. Order: interrupted compactions are finished first, then kept
// deltas are compacted (oldest first; if one fails, its bases are kept),
// then what moves is placed in the cold tier oldest first (a base before its
// dependants), then what leaves ROOT is removed newest first (dependants
// before their bases). Before those, orphans go (`ckpt::ReclaimOrphans`,
// reported as kRemoveStale with their size, after the checkpoints): every
// `.trash-*`, `.tmp-*` other than saves and stale probe file of ROOT and of
// `cold_dir`, whatever its age, as the job holds both retention locks
// (taken without waiting; `cold_dir`'s held by another job is kUnavailable
// naming it); ROOT's `.tmp-step-*` saves only if ROOT's writer lock is free
// (taken for their renames to `.trash-` names only) or if untouched for
// `stale_temp_age`.
// Removal is `ckpt::RemoveCheckpoint` (renamed to a `.trash-` name, ROOT
// fsynced, then deleted), so a half-removed checkpoint is never seen as
// complete; moving is `ckpt::CopyCheckpoint` (or a compaction into
// `cold_dir`), complete and verified before the hot copy is removed; a cold
// copy left complete by an interrupted run is recognised. Errors keep their
// file-system meaning: a full cold tier is kResourceExhausted.
// An s3:// `root` (a bucket prefix the tier fills) gets the same rules over
// its committed steps, without compaction and without a cold tier, under the
// prefix's lease: each step that goes loses its commit marker first, then
// the objects the marker lists (docs/object-storage.md).
absl::StatusOr<std::vector<RetentionAction>> RunRetention(const std::string& root,
                                                          const RetentionPolicy& policy);

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_RETAIN_RETENTION_H_
