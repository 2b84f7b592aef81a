#include "io/posix_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "util/errno_status.h"

namespace ckpt::internal {

size_t DirectMemoryAlignmentOf(int fd) {
#ifdef STATX_DIOALIGN
  struct statx st {};
  if (::statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &st) == 0 && (st.stx_mask & STATX_DIOALIGN) != 0) {
    const size_t align = st.stx_dio_mem_align;
    // 0: the file system does not support O_DIRECT on this file (the open
    // would have failed); anything not a power of two is not to be trusted.
    if (align > 0 && (align & (align - 1)) == 0) return align;
  }
#endif
  (void)fd;
  return kDirectIoAlignment;
}

size_t DirectMemoryAlignment(const File& file) {
  const auto* posix = dynamic_cast<const PosixFile*>(&file);
  return posix != nullptr ? posix->direct_memory_alignment() : kDirectIoAlignment;
}

PosixFile::~PosixFile() {
  if (fd_ >= 0) ::close(fd_);
}

absl::StatusOr<size_t> PosixFile::ReadAt(uint64_t offset, std::span<char> out) {
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::pread(fd_, out.data() + done, out.size() - done,
                              static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return ErrnoToStatus(errno, absl::StrCat("read ", out.size() - done, " bytes at offset ",
                                               offset + done, " of ", path_));
    }
    if (n == 0) break;  // end of file
    done += static_cast<size_t>(n);
  }
  return done;
}

absl::Status PosixFile::WriteAt(uint64_t offset, std::span<const char> data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::pwrite(fd_, data.data() + done, data.size() - done,
                               static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    // A write that makes no progress is a full disk.
    const int error = n < 0 ? errno : n == 0 ? ENOSPC : 0;
    if (error != 0) {
      return ErrnoToStatus(error, absl::StrCat("write ", data.size() - done, " bytes at offset ",
                                               offset + done, " of ", path_));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status PosixFile::Sync() {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat("fsync ", path_, ": closed"));
  int rc;
  do rc = ::fsync(fd_);
  while (rc != 0 && errno == EINTR);
  if (rc != 0) return ErrnoToStatus(errno, absl::StrCat("fsync ", path_));
  return absl::OkStatus();
}

absl::Status PosixFile::Truncate(uint64_t size) {
  int rc;
  do rc = ::ftruncate(fd_, static_cast<off_t>(size));
  while (rc != 0 && errno == EINTR);
  if (rc != 0) return ErrnoToStatus(errno, absl::StrCat("ftruncate ", path_, " to ", size));
  return absl::OkStatus();
}

absl::Status PosixFile::Allocate(uint64_t size) {
  if (size == 0) return absl::OkStatus();
  int rc;
  do rc = ::fallocate(fd_, 0, 0, static_cast<off_t>(size));
  while (rc != 0 && errno == EINTR);
  if (rc == 0) return absl::OkStatus();
  if (errno == EOPNOTSUPP || errno == ENOSYS) {
    return absl::UnimplementedError(absl::StrCat("fallocate ", path_, ": not supported"));
  }
  return ErrnoToStatus(errno, absl::StrCat("fallocate ", path_, " to ", size));
}

absl::StatusOr<uint64_t> PosixFile::Size() {
  struct stat st;
  if (::fstat(fd_, &st) != 0) return ErrnoToStatus(errno, absl::StrCat("fstat ", path_));
  return static_cast<uint64_t>(st.st_size);
}

absl::Status PosixFile::DropCache() {
  int rc = ::posix_fadvise(fd_, 0, 0, POSIX_FADV_DONTNEED);
  if (rc != 0) return ErrnoToStatus(rc, absl::StrCat("posix_fadvise ", path_));
  return absl::OkStatus();
}

absl::Status PosixFile::Close() {
  if (fd_ < 0) return absl::OkStatus();
  int fd = fd_;
  fd_ = -1;
  // Linux releases the descriptor even when close fails, so it is never
  // retried; EINTR means the close completed.
  if (::close(fd) != 0 && errno != EINTR) {
    return ErrnoToStatus(errno, absl::StrCat("close ", path_));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> DescriptorFor(const File* file, absl::string_view queue) {
  if (file == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("I/O queue \"", queue, "\": an op has no file"));
  }
  const auto* posix = dynamic_cast<const PosixFile*>(file);
  if (posix == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "I/O queue \"", queue, "\" cannot transfer ", file->path(),
        ": not a file of the POSIX file system (opened through another FileSystem?)"));
  }
  return posix->fd();
}

}  // namespace ckpt::internal
