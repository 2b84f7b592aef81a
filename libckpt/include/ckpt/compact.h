// ckpt/compact.h: rewrites a delta checkpoint as a full one.
//
//   ckpt::CompactOptions options;
//   auto stats = ckpt::CompactToFull("/ckpt/run1", 1200, options);
//   // ROOT/step-...1200 is now a full checkpoint of the same step, tensors
//   // and values; the checkpoints it was a delta of are no longer needed by it.
//
// Retention uses this to let the bases of a kept delta go (docs/retention.md).
// The full checkpoint holds exactly what a restore of the delta yields: the
// same tensor names, order, dtypes, shapes and bytes (so the same per-tensor
// XXH3), the same extras and creation time, the shards a full save of those
// tensors would have, and each lossy tensor's `error_bound` (its values are
// the delta's restored values, so the bound against the saved values holds
// unchanged). Its manifest names the delta it replaced (`compacted_from`, see
// docs/format.md), so deltas written against that delta -- already on disk,
// or still to come from a running engine, whose reference state is those very
// values -- keep applying to it.
#ifndef CKPT_COMPACT_H_
#define CKPT_COMPACT_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckpt/file_system.h"
#include "ckpt/options.h"

namespace ckpt {

struct CompactOptions {
  // Every file-system call goes through `fs`; null means `PosixFileSystem()`.
  std::shared_ptr<FileSystem> fs;
  // Reading the chain and writing the shards (records are written raw).
  IoOptions io;
  // Shard grouping, as `EngineOptions::shard_min_bytes`/`shard_max_bytes`.
  uint64_t shard_min_bytes = uint64_t{16} << 20;
  uint64_t shard_max_bytes = uint64_t{256} << 20;
  // Empty (the default): replace step S in ROOT itself. Otherwise another
  // checkpoint root (a cold tier) that must not hold step S yet: the full
  // checkpoint is committed there by rename, and ROOT is left untouched.
  std::string target_root;
  // False (the default): `CompactToFull` takes the retention lock
  // (ckpt/root_lock.h) of ROOT, and of `target_root` if set, for its whole
  // run, failing with kUnavailable while a retention job holds one. Its temp
  // directory is then never mistaken for a dead job's by an engine opening
  // ROOT, which reclaims `.tmp-compact-*` only when it can take that lock.
  // True: the caller holds those locks already (ckpt-retain does).
  bool holds_retention_lock = false;
};

struct CompactStats {
  int64_t step = 0;
  std::string dir;            // the full checkpoint's directory
  uint64_t tensor_bytes = 0;  // sum of the tensors' sizes
  uint64_t file_bytes = 0;    // bytes of shard files written
  size_t tensor_count = 0;
  size_t shard_count = 0;
  // How the delta was replaced in place: "exchange" (renameat2
  // RENAME_EXCHANGE) or "rename" (the two-rename fallback); "" when written
  // to `target_root`.
  std::string swap;
  double seconds = 0;
};

// Rewrites delta checkpoint `step` of `root` as a full checkpoint of the same
// step. Reads the delta through `Reader` (its whole chain, every manifest and
// tensor checksum verified), writes the shards and manifest into
// ROOT/.tmp-compact-step-S-<nonce> (each file fsynced, then the directory),
// and then, in place:
//   1. checks that ROOT/step-S still holds the manifest it read;
//   2. swaps the two directories atomically with `FileSystem::Exchange`; where
//      that is unsupported, renames step-S to ROOT/.compact-old-step-S-<nonce>
//      and the new directory to step-S (between the two renames step S is
//      briefly absent; after a crash there, `FinishInterruptedCompactions`
//      puts the delta back);
//   3. fsyncs ROOT;
//   4. renames the old delta to ROOT/.trash-step-S-<nonce>, fsyncs ROOT and
//      removes it (best effort: a leftover is logged, and readers ignore it).
// ROOT/LATEST is never touched: the step does not change.
//
// On any error before step 2 the delta is untouched and the temp directory
// removed. If step 3 fails the delta is swapped back (best effort). A crash
// at any point leaves step S either the complete delta or the complete full
// checkpoint (plus, possibly, an invisible `.tmp-`/`.trash-`/`.compact-old-`
// directory). Either way step S restores to the same values.
//
// Errors: kNotFound (no step S), kFailedPrecondition (step S is already
// full, or a multi-rank checkpoint: those are not compacted), kAlreadyExists (`target_root` holds step S), kAborted (step S
// changed meanwhile), kUnavailable (a retention job holds a lock this call
// needs), kDataLoss (the chain is damaged), and I/O errors naming
// the path. Memory: one buffer of the largest tensor, plus the reader's.
//
// REQUIRES: nothing else replaces or removes step S or its bases meanwhile
// (ckpt-retain compacts under its lock, and so does every other caller, see
// `holds_retention_lock`; a running engine never rewrites a committed step). Concurrent readers of step S may fail with kDataLoss or
// kNotFound while it is swapped, never read wrong data: they verify.
absl::StatusOr<CompactStats> CompactToFull(const std::string& root, int64_t step,
                                           const CompactOptions& options = {});

// Completes what a compaction that used the two-rename fallback left when it
// was interrupted between its renames: for each ROOT/.compact-old-step-S-*,
// removes it if ROOT/step-S exists (the full checkpoint is in place),
// otherwise renames it back to ROOT/step-S and fsyncs ROOT. Returns the first
// error; carries on past it. REQUIRES: no compaction of `root` is running.
absl::Status FinishInterruptedCompactions(const std::string& root,
                                          std::shared_ptr<FileSystem> fs = nullptr);

}  // namespace ckpt

#endif  // CKPT_COMPACT_H_
