// Whole-file helpers for manifests, LATEST and metrics files, through the
// seam's synchronous `File::ReadAt` / `File::WriteAt` (no `IoQueue`), and
// removing a tree of them.
#ifndef CKPT_IO_SMALL_FILE_H_
#define CKPT_IO_SMALL_FILE_H_

#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "ckpt/file_system.h"

namespace ckpt::internal {

// Reads all of `path`, a regular file (`OpenOptions::regular_only`, opened
// without O_DIRECT). kDataLoss if it is larger than `max_bytes` (checked
// before allocating) or shrinks while it is read.
absl::StatusOr<std::string> ReadSmallFile(FileSystem& fs, const std::string& path,
                                          uint64_t max_bytes);

// Creates `path` (which must not exist), writes `contents`, fsyncs and closes
// it. Any failure is returned with the path; the file may be left behind.
absl::Status WriteFileDurably(FileSystem& fs, const std::string& path, absl::string_view contents);

// Removes `path` and, when it is a directory (not a symlink to one),
// everything under it, depth first; an entry gone meanwhile is fine. The
// first other error is returned and stops the removal. (What the public
// `RemoveTree`, ckpt/maintenance.h, does.)
absl::Status RemoveFileTree(FileSystem& fs, const std::string& path);

// `RemoveFileTree`, ignoring errors: the caller checks what is left where
// it matters.
void RemoveTreeBestEffort(FileSystem& fs, const std::string& path);

}  // namespace ckpt::internal

#endif  // CKPT_IO_SMALL_FILE_H_
