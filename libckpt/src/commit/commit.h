// The commit protocol: how a finished temp directory becomes a checkpoint.
#ifndef CKPT_COMMIT_COMMIT_H_
#define CKPT_COMMIT_COMMIT_H_

#include <string>

#include "absl/status/status.h"
#include "ckpt/file_system.h"

namespace ckpt::internal {

// REQUIRES: every file in `temp_dir` is written, fsynced and closed.
// 1. fsync `temp_dir`;  2. rename it to `root/final_name` (RENAME_NOREPLACE);
// 3. fsync `root`;  4. replace root/LATEST (temp file, fsync, rename, fsync root).
// Any failure before 3 completes leaves the checkpoint invisible (the caller
// removes `temp_dir`); a failure at 3 or 4 puts LATEST back as it was (or
// removes it if there was none), then renames the new directory away to a
// trash name and removes it, so a save that returns an error never leaves a
// visible checkpoint nor a LATEST naming one. The first error is returned;
// cleanup is best effort and never hides it.
absl::Status CommitCheckpoint(FileSystem& fs, const std::string& root,
                              const std::string& temp_dir, const std::string& final_name);

}  // namespace ckpt::internal

#endif  // CKPT_COMMIT_COMMIT_H_
