// The real file system: POSIX calls, with io_uring or a thread pool for bulk
// data (its files are `internal::PosixFile`, io/posix_file.h).
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ckpt/file_system.h"
#include "io/posix_file.h"
#include "io/thread_io_queue.h"
#include "io/uring_io_queue.h"
#include "util/errno_status.h"

namespace ckpt {
namespace {

using internal::ErrnoToStatus;
using internal::PosixFile;

class PosixFileLock final : public FileLock {
 public:
  PosixFileLock(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixFileLock() override {
    ::flock(fd_, LOCK_UN);
    ::close(fd_);
  }
  const std::string& path() const override { return path_; }

 private:
  const std::string path_;
  const int fd_;
};

// What the holder of lock file `fd` wrote into it: its first line, at most
// 256 bytes, non-printable bytes dropped. Empty if unreadable.
std::string LockHolder(int fd) {
  char buf[256];
  ssize_t n;
  do n = ::pread(fd, buf, sizeof(buf), 0);
  while (n < 0 && errno == EINTR);
  std::string holder;
  for (ssize_t i = 0; i < n && buf[i] != '\n'; ++i) {
    if (buf[i] >= 0x20 && buf[i] < 0x7f) holder.push_back(buf[i]);
  }
  return holder;
}

// open(2) of `path` with `flags`, retried on EINTR; files it creates get mode
// 0640 (less the umask). With `regular_only`, anything at `path` but a
// regular file is refused without being followed (O_NOFOLLOW) or blocked on
// (O_NONBLOCK, then fstat; the flag is cleared again on success):
// kFailedPrecondition saying what stands there. Errors start with `what`.
absl::StatusOr<int> OpenDescriptor(const std::string& path, int flags, bool regular_only,
                                   absl::string_view what) {
  if (regular_only) flags |= O_NOFOLLOW | O_NONBLOCK;
  int fd;
  do fd = ::open(path.c_str(), flags, 0640);
  while (fd < 0 && errno == EINTR);
  if (fd < 0 && regular_only && errno == ELOOP) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": a symbolic link, not a regular file (refused)"));
  }
  if (fd < 0) return internal::ErrnoToStatus(errno, what);
  if (!regular_only) return fd;
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int error = errno;
    ::close(fd);
    return internal::ErrnoToStatus(error, absl::StrCat(what, ": fstat"));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": ", S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a FIFO" : "a special file",
        ", not a regular file (refused)"));
  }
  // Regular files ignore O_NONBLOCK, but clear it all the same.
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

class PosixFileSystemImpl final : public FileSystem {
 public:
  absl::string_view name() const override { return "posix"; }

  absl::StatusOr<std::unique_ptr<File>> Open(const std::string& path,
                                             const OpenOptions& options) override {
    int flags = O_CLOEXEC;
    if (options.read && options.write) flags |= O_RDWR;
    else if (options.write) flags |= O_WRONLY;
    else flags |= O_RDONLY;
    if (options.create) flags |= O_CREAT;
    if (options.exclusive) flags |= O_EXCL;
    if (options.truncate) flags |= O_TRUNC;
    if (options.direct) flags |= O_DIRECT;
    absl::StatusOr<int> fd = OpenDescriptor(
        path, flags, options.regular_only, absl::StrCat("open ", path, options.direct ? " (O_DIRECT)" : ""));
    if (!fd.ok()) return fd.status();
    return std::make_unique<PosixFile>(path, *fd, options.direct);
  }

  absl::Status CreateDir(const std::string& path) override {
    if (::mkdir(path.c_str(), 0750) != 0) return ErrnoToStatus(errno, absl::StrCat("mkdir ", path));
    return absl::OkStatus();
  }

  absl::Status RemoveFile(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) return ErrnoToStatus(errno, absl::StrCat("unlink ", path));
    return absl::OkStatus();
  }

  absl::Status RemoveDir(const std::string& path) override {
    if (::rmdir(path.c_str()) != 0) return ErrnoToStatus(errno, absl::StrCat("rmdir ", path));
    return absl::OkStatus();
  }

  absl::Status Rename(const std::string& from, const std::string& to, RenameMode mode) override {
    std::string context = absl::StrCat("rename ", from, " to ", to);
    if (mode == RenameMode::kReplace) {
      if (::rename(from.c_str(), to.c_str()) != 0) return ErrnoToStatus(errno, context);
      return absl::OkStatus();
    }
    if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) {
      return absl::OkStatus();
    }
    if (errno != EINVAL && errno != ENOSYS) return ErrnoToStatus(errno, context);
    // The file system lacks RENAME_NOREPLACE: check, then rename. Only one
    // writer commits into a root at a time, so the window is benign.
    struct stat st;
    if (::lstat(to.c_str(), &st) == 0) return ErrnoToStatus(EEXIST, context);
    if (::rename(from.c_str(), to.c_str()) != 0) return ErrnoToStatus(errno, context);
    return absl::OkStatus();
  }

  absl::Status Exchange(const std::string& a, const std::string& b) override {
    if (::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) == 0) {
      return absl::OkStatus();
    }
    const int error = errno;
    const std::string context = absl::StrCat("exchange ", a, " and ", b);
    if (error == EINVAL || error == ENOSYS || error == EOPNOTSUPP) {
      return absl::UnimplementedError(absl::StrCat(
          context, ": RENAME_EXCHANGE is not supported here (", internal::ErrnoName(error), ")"));
    }
    return ErrnoToStatus(error, context);
  }

  absl::Status SyncDir(const std::string& path) override {
    int fd;
    do fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    while (fd < 0 && errno == EINTR);
    if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("open directory ", path));
    int rc;
    do rc = ::fsync(fd);
    while (rc != 0 && errno == EINTR);
    int saved = errno;
    ::close(fd);
    if (rc != 0) return ErrnoToStatus(saved, absl::StrCat("fsync directory ", path));
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) override {
    DIR* dir = ::opendir(path.c_str());
    if (dir == nullptr) return ErrnoToStatus(errno, absl::StrCat("opendir ", path));
    std::vector<std::string> names;
    errno = 0;
    while (struct dirent* entry = ::readdir(dir)) {
      absl::string_view name = entry->d_name;
      if (name != "." && name != "..") names.emplace_back(name);
      errno = 0;
    }
    int saved = errno;
    ::closedir(dir);
    if (saved != 0) return ErrnoToStatus(saved, absl::StrCat("readdir ", path));
    return names;
  }

  absl::StatusOr<FileStat> Stat(const std::string& path) override {
    // lstat first: one call for everything but a symlink, which is then
    // followed with stat. A dangling link exists (as a link to nothing).
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0) return ErrnoToStatus(errno, absl::StrCat("stat ", path));
    FileStat result;
    result.is_symlink = S_ISLNK(st.st_mode);
    if (result.is_symlink) {
      struct stat target;
      if (::stat(path.c_str(), &target) == 0) {
        st = target;
      } else if (errno != ENOENT && errno != ELOOP) {
        return ErrnoToStatus(errno, absl::StrCat("stat ", path));
      }
    }
    result.is_directory = S_ISDIR(st.st_mode);
    result.size = static_cast<uint64_t>(st.st_size);
    result.mtime_ns = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
    return result;
  }

  absl::StatusOr<std::unique_ptr<FileLock>> LockFile(const std::string& path,
                                                     absl::string_view owner) override {
    // A symlink planted at `path` is refused, not followed; a FIFO cannot
    // hang the open.
    absl::StatusOr<int> opened = OpenDescriptor(path, O_RDWR | O_CREAT | O_CLOEXEC,
                                                /*regular_only=*/true, absl::StrCat("open lock file ", path));
    if (!opened.ok()) return opened.status();
    const int fd = *opened;
    int rc;
    do rc = ::flock(fd, LOCK_EX | LOCK_NB);
    while (rc != 0 && errno == EINTR);
    if (rc != 0) {
      const int error = errno;
      const std::string holder = LockHolder(fd);
      ::close(fd);
      if (error != EWOULDBLOCK) return ErrnoToStatus(error, absl::StrCat("flock ", path));
      return absl::UnavailableError(absl::StrCat(
          path, " is locked by ", holder.empty() ? "another open file (holder unknown)" : holder));
    }
    const std::string line = absl::StrCat(owner, "\n");
    ssize_t written = -1;
    if (::ftruncate(fd, 0) == 0) {
      do written = ::pwrite(fd, line.data(), line.size(), 0);
      while (written < 0 && errno == EINTR);
    }
    if (written != static_cast<ssize_t>(line.size())) {
      const int error = written < 0 ? errno : EIO;
      ::close(fd);  // releases the lock
      return ErrnoToStatus(error, absl::StrCat("write lock file ", path));
    }
    return std::make_unique<PosixFileLock>(path, fd);
  }

  absl::StatusOr<std::unique_ptr<IoQueue>> NewIoQueue(IoQueueKind kind, size_t depth) override {
    if (depth == 0) return absl::InvalidArgumentError("I/O queue depth must be positive");
    if (kind == IoQueueKind::kUring) return internal::NewUringIoQueue(depth);
    return internal::NewThreadIoQueue(depth);
  }
};

}  // namespace

absl::Status File::Allocate(uint64_t size) {
  return absl::UnimplementedError(absl::StrCat("fallocate ", path(), ": not supported"));
}

absl::Status FileSystem::Exchange(const std::string& a, const std::string& b) {
  return absl::UnimplementedError(
      absl::StrCat("exchange ", a, " and ", b, ": file system \"", name(), "\" cannot"));
}

absl::StatusOr<std::unique_ptr<FileLock>> FileSystem::LockFile(const std::string& path,
                                                               absl::string_view owner) {
  return absl::UnimplementedError(
      absl::StrCat("lock ", path, ": file system \"", name(), "\" cannot lock files"));
}

std::shared_ptr<FileSystem> PosixFileSystem() {
  static const std::shared_ptr<FileSystem> fs = std::make_shared<PosixFileSystemImpl>();
  return fs;
}

}  // namespace ckpt
