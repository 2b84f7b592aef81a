// The retention/tiering job behind `ckpt-retain`: which checkpoints of a root
// to keep, and moving or deleting the rest without ever breaking a delta chain
// or disturbing a writer.
#ifndef CKPT_TOOLS_RETENTION_H_
#define CKPT_TOOLS_RETENTION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ckpt::tools {

struct RetentionPolicy {
  int keep_last = 0;                               // the newest N steps
  int64_t keep_every = 0;                          // steps divisible by K
  absl::Duration keep_newer_than = absl::ZeroDuration();  // created within this
  std::string cold_dir;                            // move instead of delete
  absl::Duration stale_temp_age = absl::Hours(1);  // .tmp-/.trash- entries older than this go
  bool dry_run = false;
};

struct RetentionAction {
  enum class Kind { kKeep, kMove, kDelete, kRemoveStale, kSkipDamaged };
  Kind kind;
  std::string name;    // entry in ROOT
  int64_t step = -1;   // -1 for stale entries
  std::string reason;  // why kept / removed
  bool done = false;   // carried out (false in a dry run or on failure)
  std::string error;
};

const char* ActionName(RetentionAction::Kind kind);

// Plans (and unless `dry_run`, carries out) retention over `root`, holding
// an exclusive flock on ROOT/.ckpt-retain.lock meanwhile. Always kept: the
// newest step, the step ROOT/LATEST names, every step a rule keeps, and every
// base that a kept delta needs (transitively), so no chain is ever broken.
// Damaged checkpoints are left alone and reported. Removal renames the
// directory to a `.trash-` name and fsyncs ROOT before deleting, so a
// half-removed checkpoint is never seen as complete. Moving copies to
// `cold_dir` under a temp name, fsyncs, compares every file's XXH3 with the
// source, renames into place and fsyncs before the hot copy is removed.
absl::StatusOr<std::vector<RetentionAction>> RunRetention(const std::string& root,
                                                          const RetentionPolicy& policy);

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_RETENTION_H_
