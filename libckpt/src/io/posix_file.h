// `PosixFile`: the `File` of the real file system, an open descriptor. The
// POSIX queues (io_uring, threads) transfer through its descriptor, which the
// public `File` does not expose.
#ifndef CKPT_IO_POSIX_FILE_H_
#define CKPT_IO_POSIX_FILE_H_

#include <cstdint>
#include <span>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ckpt/file_system.h"

namespace ckpt::internal {

// What `statx` STATX_DIOALIGN says O_DIRECT memory of `fd` must be aligned
// to (4 bytes on NVMe, 512 on virtio); `kDirectIoAlignment` where the kernel
// or file system does not say.
size_t DirectMemoryAlignmentOf(int fd);

class PosixFile final : public File {
 public:
  // Takes ownership of `fd`, opened on `path` (with O_DIRECT when `direct`).
  PosixFile(std::string path, int fd, bool direct)
      : path_(std::move(path)), fd_(fd), direct_(direct),
        memory_alignment_(direct ? DirectMemoryAlignmentOf(fd) : kDirectIoAlignment) {}
  ~PosixFile() override;

  // The descriptor, or -1 once `Close` was called.
  int fd() const { return fd_; }

  const std::string& path() const override { return path_; }
  bool direct() const override { return direct_; }
  // The memory alignment its O_DIRECT transfers need (see
  // `DirectMemoryAlignment`).
  size_t direct_memory_alignment() const { return memory_alignment_; }
  absl::StatusOr<size_t> ReadAt(uint64_t offset, std::span<char> out) override;
  absl::Status WriteAt(uint64_t offset, std::span<const char> data) override;
  absl::Status Sync() override;
  absl::Status Truncate(uint64_t size) override;
  absl::Status Allocate(uint64_t size) override;
  absl::StatusOr<uint64_t> Size() override;
  absl::Status DropCache() override;
  absl::Status Close() override;

 private:
  const std::string path_;
  int fd_;
  const bool direct_;
  const size_t memory_alignment_;
};

// The alignment of memory that O_DIRECT transfers of `file` need: a
// `PosixFile`'s own, `kDirectIoAlignment` for any other file. (Offsets and
// lengths stay `kDirectIoAlignment` multiples.) Memory aligned this way is
// read into in place; other memory goes through bounce chunks.
size_t DirectMemoryAlignment(const File& file);

// The descriptor a POSIX queue named `queue` transfers `file` through:
// kInvalidArgument naming the path if `file` is not a `PosixFile` (a file of
// another file system, or one still wrapped by a test file system), or null.
absl::StatusOr<int> DescriptorFor(const File* file, absl::string_view queue);

}  // namespace ckpt::internal

#endif  // CKPT_IO_POSIX_FILE_H_
