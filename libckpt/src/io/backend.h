// Choosing how a root is written: io_uring or threads, O_DIRECT or buffered.
#ifndef CKPT_IO_BACKEND_H_
#define CKPT_IO_BACKEND_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "ckpt/file_system.h"
#include "ckpt/options.h"

namespace ckpt::internal {

// An opened I/O path: the queue, and whether files are opened O_DIRECT.
// (Not `ckpt::IoBackend`, the public enum that asks for one.)
struct OpenedIo {
  std::unique_ptr<IoQueue> queue;
  bool direct = false;
  std::string description;  // "io_uring+O_DIRECT", "threads+buffered", ...
};

// Creates the I/O queue `options.backend` asks for (with kAuto: io_uring,
// else threads) and, when `probe_dir` is not empty, decides O_DIRECT by
// writing a probe file there: a file system that refuses O_DIRECT at open or
// at the first write (tmpfs, some FUSE and network file systems) gets
// buffered I/O. Forced choices that are refused are errors. Logs the choice.
absl::StatusOr<OpenedIo> OpenIo(FileSystem& fs, const IoOptions& options,
                                 const std::string& probe_dir);

}  // namespace ckpt::internal

#endif  // CKPT_IO_BACKEND_H_
