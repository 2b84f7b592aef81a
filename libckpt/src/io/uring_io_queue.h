// An `IoQueue` on io_uring.
#ifndef CKPT_IO_URING_IO_QUEUE_H_
#define CKPT_IO_URING_IO_QUEUE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "ckpt/file_system.h"

namespace ckpt::internal {

// kUnavailable (with the kernel's reason) when io_uring cannot be set up,
// e.g. EPERM from a seccomp policy or ENOSYS from an old kernel.
absl::StatusOr<std::unique_ptr<IoQueue>> NewUringIoQueue(size_t depth);

}  // namespace ckpt::internal

#endif  // CKPT_IO_URING_IO_QUEUE_H_
