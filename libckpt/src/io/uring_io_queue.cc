#include "io/uring_io_queue.h"

#include <liburing.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "io/posix_file.h"
#include "util/errno_status.h"
#include "util/log.h"

namespace ckpt::internal {
namespace {

class UringIoQueue final : public IoQueue {
 public:
  explicit UringIoQueue(size_t depth) : depth_(depth) {}
  ~UringIoQueue() override {
    // Transfers still in flight would write into freed memory: wait them out.
    std::vector<IoCompletion> ignored;
    if (in_flight_ > 0) (void)Reap(in_flight_, &ignored);
    if (initialized_) io_uring_queue_exit(&ring_);
  }

  absl::Status Init() {
    int rc = io_uring_queue_init(static_cast<unsigned>(depth_), &ring_, 0);
    if (rc < 0) {
      return absl::UnavailableError(absl::StrCat("io_uring_queue_init(", depth_,
                                                 ") refused: ", std::strerror(-rc), " (",
                                                 ErrnoName(-rc), ")"));
    }
    initialized_ = true;
    return absl::OkStatus();
  }

  absl::string_view name() const override { return "io_uring"; }
  size_t depth() const override { return depth_; }

  absl::Status RegisterBuffers(std::span<const std::span<char>> buffers) override {
    if (registered_) {
      io_uring_unregister_buffers(&ring_);
      registered_ = false;
    }
    if (buffers.empty()) return absl::OkStatus();
    std::vector<iovec> iovecs;
    iovecs.reserve(buffers.size());
    for (std::span<char> b : buffers) iovecs.push_back(iovec{b.data(), b.size()});
    int rc = io_uring_register_buffers(&ring_, iovecs.data(), static_cast<unsigned>(iovecs.size()));
    if (rc < 0) return ErrnoToStatus(-rc, "io_uring_register_buffers");
    registered_ = true;
    return absl::OkStatus();
  }

  absl::Status Submit(std::span<const IoOp> ops) override {
    if (in_flight_ + ops.size() > depth_) {
      return absl::InternalError(absl::StrCat("io_uring queue over depth: ", in_flight_, " + ",
                                              ops.size(), " > ", depth_));
    }
    // Every op's descriptor first: an op this queue cannot run fails the
    // whole Submit before any is queued.
    fds_.clear();
    for (const IoOp& op : ops) {
      absl::StatusOr<int> fd = DescriptorFor(op.file, name());
      if (!fd.ok()) return fd.status();
      fds_.push_back(*fd);
    }
    for (size_t i = 0; i < ops.size(); ++i) {
      const IoOp& op = ops[i];
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (sqe == nullptr) return absl::InternalError("io_uring submission queue full");
      const int fd = fds_[i];
      const bool fixed = registered_ && op.buf_index >= 0;
      if (op.kind == IoOp::Kind::kWrite) {
        if (fixed) io_uring_prep_write_fixed(sqe, fd, op.buf, op.length, op.offset, op.buf_index);
        else io_uring_prep_write(sqe, fd, op.buf, op.length, op.offset);
      } else {
        if (fixed) io_uring_prep_read_fixed(sqe, fd, op.buf, op.length, op.offset, op.buf_index);
        else io_uring_prep_read(sqe, fd, op.buf, op.length, op.offset);
      }
      io_uring_sqe_set_data64(sqe, op.tag);
    }
    // Until the kernel has taken every queued entry (a submit may take
    // fewer); what it still refuses after a few tries is handed over again
    // by Reap's wait slices.
    for (int tries = 0; io_uring_sq_ready(&ring_) > 0 && tries < 16; ++tries) {
      int rc = io_uring_submit(&ring_);
      if (rc == -EINTR || rc == -EAGAIN || rc == -EBUSY) continue;
      if (rc < 0) return ErrnoToStatus(-rc, "io_uring_submit");
    }
    in_flight_ += ops.size();
    return absl::OkStatus();
  }

  absl::Status Reap(size_t min_complete, std::vector<IoCompletion>* out) override {
    if (min_complete > in_flight_) min_complete = in_flight_;
    size_t reaped = 0;
    while (true) {
      io_uring_cqe* cqes[64];
      unsigned n = io_uring_peek_batch_cqe(&ring_, cqes, 64);
      for (unsigned i = 0; i < n; ++i) {
        out->push_back(IoCompletion{io_uring_cqe_get_data64(cqes[i]), cqes[i]->res});
      }
      io_uring_cq_advance(&ring_, n);
      reaped += n;
      in_flight_ -= n;
      if (reaped >= min_complete) return absl::OkStatus();
      // Waits in slices: a transfer counted in flight whose entry the
      // kernel has not taken yet (a submit that took fewer than queued)
      // would never complete, so each slice that ends with none done hands
      // the kernel what is still queued. (A test run hung here for 600 s
      // with the queue believing transfers were in flight.)
      io_uring_cqe* cqe = nullptr;
      __kernel_timespec slice{.tv_sec = 1, .tv_nsec = 0};
      int rc = io_uring_wait_cqe_timeout(&ring_, &cqe, &slice);
      if (rc == -ETIME) {
        if (io_uring_sq_ready(&ring_) > 0) {
          const unsigned queued = io_uring_sq_ready(&ring_);
          const int submitted = io_uring_submit(&ring_);
          Log(LogLevel::kWarning,
              absl::StrCat("io_uring: ", queued, " queued transfer(s) had not been taken by the kernel; ",
                           "submitted again (", submitted, ")"));
        }
        continue;
      }
      if (rc == -EINTR || rc == -EAGAIN) continue;
      if (rc < 0) return ErrnoToStatus(-rc, "io_uring_wait_cqe");
    }
  }

 private:
  const size_t depth_;
  io_uring ring_{};
  bool initialized_ = false;
  bool registered_ = false;
  size_t in_flight_ = 0;
  std::vector<int> fds_;  // descriptors of the ops being submitted
};

}  // namespace

absl::StatusOr<std::unique_ptr<IoQueue>> NewUringIoQueue(size_t depth) {
  auto queue = std::make_unique<UringIoQueue>(depth);
  absl::Status status = queue->Init();
  if (!status.ok()) return status;
  return queue;
}

}  // namespace ckpt::internal
