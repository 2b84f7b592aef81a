// An `IoQueue` on a pool of threads calling pread/pwrite: the fallback when
// io_uring is refused.
#ifndef CKPT_IO_THREAD_IO_QUEUE_H_
#define CKPT_IO_THREAD_IO_QUEUE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "ckpt/file_system.h"

namespace ckpt::internal {

// Up to `depth` transfers run at once on min(depth, 16) threads.
absl::StatusOr<std::unique_ptr<IoQueue>> NewThreadIoQueue(size_t depth);

}  // namespace ckpt::internal

#endif  // CKPT_IO_THREAD_IO_QUEUE_H_
