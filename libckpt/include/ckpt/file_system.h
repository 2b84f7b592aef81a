// ckpt/file_system.h: the one seam every file-system call of ckpt goes through.
//
// The library never calls open/pwrite/fsync/rename/... directly: it asks a
// `FileSystem`. Tests wrap one to inject faults (EIO, ENOSPC, short writes,
// EINTR, a crash at the Nth call); `PosixFileSystem()` is the real one.
//
// Data moves two ways: bulk shard data through an `IoQueue` (many transfers
// in flight, io_uring or a thread pool), and small files (manifests, LATEST,
// metrics files) through `File::ReadAt` / `File::WriteAt`, one synchronous
// transfer at a time.
//
// The contract is deliberately close to the system calls, so that injected
// faults exercise the library's own retry and error paths:
// - `IoQueue` completions report what the kernel reported: a byte count that
//   may be short, or a negative errno (-EINTR and -EAGAIN included). The
//   library resubmits short transfers, -EINTR and -EAGAIN; it never passes
//   them to its callers.
// - `File::ReadAt` and `File::WriteAt` retry short transfers and EINTR
//   themselves: they move every byte (a read stops early only at end of
//   file) or fail.
// - Every other call returns an `absl::Status` whose message names the path.
#ifndef CKPT_FILE_SYSTEM_H_
#define CKPT_FILE_SYSTEM_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ckpt {

// Block size and alignment of O_DIRECT buffers, offsets and lengths.
inline constexpr size_t kDirectIoAlignment = 4096;

// `n` rounded up to a multiple of `alignment` (> 0): sizes of O_DIRECT
// buffers, record offsets.
constexpr uint64_t AlignUp(uint64_t n, uint64_t alignment = kDirectIoAlignment) {
  return (n + alignment - 1) / alignment * alignment;
}
// `n` rounded down to a multiple of `alignment` (> 0).
constexpr uint64_t AlignDown(uint64_t n, uint64_t alignment = kDirectIoAlignment) {
  return n / alignment * alignment;
}

struct OpenOptions {
  bool read = true;
  bool write = false;
  bool create = false;     // O_CREAT
  bool exclusive = false;  // O_EXCL (with create)
  bool truncate = false;   // O_TRUNC
  // O_DIRECT: buffers, offsets and lengths must be `kDirectIoAlignment`
  // aligned. A file system that refuses O_DIRECT fails the open with
  // kInvalidArgument (EINVAL), which callers use as the probe.
  bool direct = false;
  // Refuse anything at `path` but a regular file, without blocking: a
  // symlink (O_NOFOLLOW) and a FIFO, device, socket or directory (opened
  // O_NONBLOCK, checked with fstat, then closed) fail with
  // kFailedPrecondition naming the path. Every file ckpt reads from a
  // checkpoint directory (manifests, LATEST, shards) is opened this way, so
  // a planted FIFO cannot hang a reader and a symlink cannot redirect it.
  bool regular_only = false;
};

// `File` is an open file. Not thread-safe except where noted. Bulk data goes
// through an `IoQueue` of the same file system (a queue refuses files of
// another one); small files use `ReadAt` and `WriteAt`.
class File {
 public:
  virtual ~File() = default;

  virtual const std::string& path() const = 0;
  virtual bool direct() const = 0;

  // pread(2) of up to `out.size()` bytes at `offset`, retried on EINTR and
  // after short reads until `out` is full or the file ends. Returns how many
  // bytes were read: all of `out` unless the file ends first (0 at or past
  // its end). With `direct()`, `out.data()`, `out.size()` and `offset` must
  // be multiples of `kDirectIoAlignment` (the small files ckpt reads this
  // way are opened without `OpenOptions::direct`). Errors name the path.
  virtual absl::StatusOr<size_t> ReadAt(uint64_t offset, std::span<char> out) = 0;
  // pwrite(2) of all of `data` at `offset`, retried on EINTR and after short
  // writes; a write that makes no progress is ENOSPC (kResourceExhausted).
  // OK means every byte was handed to the kernel (durable after `Sync`); an
  // error names the path, and part of `data` may have been written. The
  // file must be open for writing; `direct()` alignment as for `ReadAt`.
  virtual absl::Status WriteAt(uint64_t offset, std::span<const char> data) = 0;

  // fsync(2): on success every byte written and the file size are durable.
  // A failure means the file's contents are unknown: callers abandon it.
  virtual absl::Status Sync() = 0;
  virtual absl::Status Truncate(uint64_t size) = 0;
  // fallocate(2) mode 0: reserves blocks for bytes [0, size) and makes the
  // file at least `size` long (the new bytes read as zeros). A hint for
  // writing a file of known size: its extents come out contiguous, and a full
  // disk fails here, before any data is written. kUnimplemented where the
  // file system cannot (and by default, for implementations that predate it).
  virtual absl::Status Allocate(uint64_t size);
  virtual absl::StatusOr<uint64_t> Size() = 0;
  // Advises the kernel to drop cached pages (best effort; benchmarks use it
  // to restore cold).
  virtual absl::Status DropCache() = 0;
  // close(2). Errors are reported (a close error poisons a checkpoint). The
  // destructor closes silently if `Close` was not called.
  virtual absl::Status Close() = 0;
};

// An exclusive advisory lock on a file, taken by `FileSystem::LockFile` and
// held until this object is destroyed. The kernel drops it when the process
// dies, however it dies.
class FileLock {
 public:
  virtual ~FileLock() = default;
  virtual const std::string& path() const = 0;
};

// One data transfer. `buf` must stay valid until its completion is reaped.
struct IoOp {
  enum class Kind : uint8_t { kRead, kWrite };
  Kind kind = Kind::kWrite;
  File* file = nullptr;
  uint64_t offset = 0;
  void* buf = nullptr;
  uint32_t length = 0;
  // Index of the registered buffer (`IoQueue::RegisterBuffers`) that holds
  // `buf`, or -1.
  int buf_index = -1;
  uint64_t tag = 0;  // returned in the completion
};

struct IoCompletion {
  uint64_t tag = 0;
  int64_t result = 0;  // bytes transferred (maybe fewer than asked), or -errno
};

// `IoQueue` runs many transfers at once (io_uring, or a thread pool). One
// thread uses a queue at a time.
class IoQueue {
 public:
  virtual ~IoQueue() = default;
  virtual absl::string_view name() const = 0;
  // The most transfers in flight at once.
  virtual size_t depth() const = 0;
  // Declares `buffers` as memory that will carry many transfers, so that a
  // backend may prepare it once instead of per transfer (pin it, map it):
  // an `IoOp` whose `buf` lies in `buffers[i]` may then say `buf_index = i`.
  // Replaces any earlier set; an empty span drops it. REQUIRES: no transfer
  // using a registered buffer is in flight, and the memory stays valid until
  // it is replaced, dropped or the queue is destroyed. kUnimplemented where
  // the queue has no use for it; callers carry on with `buf_index = -1`.
  virtual absl::Status RegisterBuffers(std::span<const std::span<char>> buffers) = 0;
  // Starts `ops`. REQUIRES: in-flight count + ops.size() <= depth().
  // An error here means none of `ops` started: kInvalidArgument (naming the
  // path) when an op's file is not one this queue can transfer, e.g. a file
  // opened by another file system.
  virtual absl::Status Submit(std::span<const IoOp> ops) = 0;
  // Waits until at least `min_complete` transfers finished and appends every
  // finished one to `out`.
  virtual absl::Status Reap(size_t min_complete, std::vector<IoCompletion>* out) = 0;
};

enum class IoQueueKind : uint8_t {
  kUring,    // io_uring
  kThreads,  // a pool of threads calling pwrite/pread
};

struct FileStat {
  bool is_directory = false;  // of what `path` names, symlinks followed
  // `path` itself is a symbolic link (lstat). A dangling one (or a loop) is
  // reported as such, with the link's own size and time.
  bool is_symlink = false;
  uint64_t size = 0;
  int64_t mtime_ns = 0;
};

enum class RenameMode : uint8_t {
  kReplace,    // rename(2): atomically replaces an existing target file
  kNoReplace,  // renameat2(RENAME_NOREPLACE): kAlreadyExists if target exists
};

class FileSystem {
 public:
  virtual ~FileSystem() = default;
  virtual absl::string_view name() const = 0;

  virtual absl::StatusOr<std::unique_ptr<File>> Open(const std::string& path,
                                                     const OpenOptions& options) = 0;
  // mkdir(2) with mode 0750 (less the umask); kAlreadyExists if `path`
  // exists. Files are created with mode 0640 (less the umask).
  virtual absl::Status CreateDir(const std::string& path) = 0;
  virtual absl::Status RemoveFile(const std::string& path) = 0;
  // rmdir(2): the directory must be empty.
  virtual absl::Status RemoveDir(const std::string& path) = 0;
  virtual absl::Status Rename(const std::string& from, const std::string& to,
                              RenameMode mode) = 0;
  // renameat2(RENAME_EXCHANGE): atomically swaps the entries `a` and `b`
  // (both must exist; either may be a directory). kUnimplemented where the
  // file system or kernel cannot (EINVAL, ENOSYS, EOPNOTSUPP) -- callers then
  // fall back to two renames -- and by default, for implementations that
  // predate it.
  virtual absl::Status Exchange(const std::string& a, const std::string& b);
  // Makes the entries of directory `path` durable (open + fsync + close).
  virtual absl::Status SyncDir(const std::string& path) = 0;
  // Names in `path`, without "." and "..", unsorted.
  virtual absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) = 0;
  // kNotFound if `path` does not exist.
  virtual absl::StatusOr<FileStat> Stat(const std::string& path) = 0;
  // Takes an exclusive lock on the file `path` without waiting, creating it
  // if missing (mode 0640 less the umask; never through a symlink, and only
  // a regular file locks). Once locked, the file's contents become `owner`
  // (one line saying who holds it, e.g. "pid 42 on host a"), which is what a
  // later locker is told. flock(2) semantics: the lock belongs to this open,
  // so a second `LockFile` of the same path fails within one process as it
  // does from another, and a holder that dies releases it at once.
  // kUnavailable while someone holds it (the message names the path and the
  // holder's owner line); kFailedPrecondition when `path` is a symlink or
  // not a regular file; kUnimplemented by default, for implementations that
  // predate it.
  virtual absl::StatusOr<std::unique_ptr<FileLock>> LockFile(const std::string& path,
                                                             absl::string_view owner);
  // A queue of `depth` concurrent transfers. kUnavailable (with the reason)
  // where `kind` cannot run here, e.g. io_uring refused by a seccomp policy.
  virtual absl::StatusOr<std::unique_ptr<IoQueue>> NewIoQueue(IoQueueKind kind,
                                                              size_t depth) = 0;
};

// The real file system. Thread-safe; lives for the whole process.
std::shared_ptr<FileSystem> PosixFileSystem();

}  // namespace ckpt

#endif  // CKPT_FILE_SYSTEM_H_
