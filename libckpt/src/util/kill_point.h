// Named kill points: places in the save and commit path where a test can
// have the process killed with SIGKILL, to prove that a crash there loses
// nothing that was acknowledged (tests/python/test_kill9.py).
//
// Armed by the environment, read once per process:
//   CKPT_KILL_POINT=commit.renamed        the first time that point is reached
//   CKPT_KILL_POINT=commit.renamed:3      the third time
// Unset (the normal case), a kill point costs one relaxed atomic load.
// The points, in the order a save reaches them:
//   save.staged           every byte of the save is in staging memory
//   save.written          every shard's data is written (not yet fsynced)
//   save.synced           every shard is fsynced and closed
//   commit.manifest       the manifest is written and fsynced in the temp dir
//   commit.dir_synced     the temp dir is fsynced (still invisible)
//   commit.renamed        the temp dir is renamed to its final name (ROOT not fsynced)
//   commit.root_synced    ROOT is fsynced: the checkpoint is durable
//   commit.latest         LATEST is replaced (ROOT not yet fsynced again)
//   commit.done           the commit is complete, before the caller hears of it
#ifndef CKPT_UTIL_KILL_POINT_H_
#define CKPT_UTIL_KILL_POINT_H_

#include "absl/strings/string_view.h"

namespace ckpt::internal {

// SIGKILLs this process if `name` is the armed point and this is its armed
// occurrence.
void KillPoint(absl::string_view name);

}  // namespace ckpt::internal

#endif  // CKPT_UTIL_KILL_POINT_H_
