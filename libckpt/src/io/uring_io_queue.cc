#include "io/uring_io_queue.h"

#include <liburing.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "io/posix_file.h"
#include "util/errno_status.h"
#include "util/log.h"

#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#endif

namespace ckpt::internal {
namespace {

// How long a wait with transfers in flight and none completing goes before it
// is reported (then again at twice the time, and so on).
constexpr absl::Duration kNoProgressReport = absl::Seconds(30);

// ThreadSanitizer does not see liburing map or unmap a ring's memory (liburing
// makes those system calls itself), so when the kernel maps a new ring where a
// closed one was, the new ring's first writes look like races with the old
// ring's last ones, made by another thread. The kernel orders the unmap before
// the map that reuses the address; these tell ThreadSanitizer so, page by page
// (release before the unmap, acquire after the map). Nothing in other builds.
enum class RingMemory { kMapped, kUnmapping };
void AnnotateRingMemory([[maybe_unused]] io_uring& ring, [[maybe_unused]] RingMemory event) {
#if defined(__SANITIZE_THREAD__)
  constexpr uintptr_t kPage = 4096;
  auto each_page = [&](void* start, size_t bytes) {
    if (start == nullptr) return;
    const uintptr_t begin = reinterpret_cast<uintptr_t>(start) & ~(kPage - 1);
    const uintptr_t end = reinterpret_cast<uintptr_t>(start) + bytes;
    for (uintptr_t page = begin; page < end; page += kPage) {
      if (event == RingMemory::kMapped) __tsan_acquire(reinterpret_cast<void*>(page));
      else __tsan_release(reinterpret_cast<void*>(page));
    }
  };
  each_page(ring.sq.ring_ptr, ring.sq.ring_sz);
  each_page(ring.cq.ring_ptr, ring.cq.ring_sz);
  each_page(ring.sq.sqes, sizeof(io_uring_sqe) * ring.sq.ring_entries);
#endif
}

class UringIoQueue final : public IoQueue {
 public:
  explicit UringIoQueue(size_t depth) : depth_(depth) {}
  ~UringIoQueue() override {
    // Transfers still in flight would write into freed memory: wait them out.
    std::vector<IoCompletion> ignored;
    if (in_flight_ > 0) (void)Reap(in_flight_, &ignored);
    if (initialized_) {
      AnnotateRingMemory(ring_, RingMemory::kUnmapping);
      io_uring_queue_exit(&ring_);
    }
  }

  absl::Status Init() {
    int rc = io_uring_queue_init(static_cast<unsigned>(depth_), &ring_, 0);
    if (rc < 0) {
      return absl::UnavailableError(absl::StrCat("io_uring_queue_init(", depth_,
                                                 ") refused: ", std::strerror(-rc), " (",
                                                 ErrnoName(-rc), ")"));
    }
    initialized_ = true;
    AnnotateRingMemory(ring_, RingMemory::kMapped);
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
    // Room for every entry first, so a refused Submit leaves none behind
    // (an entry left queued would be handed to the kernel by a later submit
    // and complete with a tag its caller believes was never started).
    if (io_uring_sq_space_left(&ring_) < ops.size()) {
      return absl::InternalError(absl::StrCat("io_uring submission queue full: ",
                                              io_uring_sq_space_left(&ring_), " free, ",
                                              ops.size(), " needed"));
    }
    for (size_t i = 0; i < ops.size(); ++i) {
      const IoOp& op = ops[i];
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
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
    absl::Duration waited_idle;  // since the last completion
    absl::Duration next_report = kNoProgressReport;
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
      if (n > 0) {
        waited_idle = absl::ZeroDuration();
        next_report = kNoProgressReport;
      }
      // Waits in slices: a transfer counted in flight whose entry the
      // kernel has not taken yet (a submit that took fewer than queued)
      // would never complete, so each slice that ends with none done hands
      // the kernel what is still queued. (A test run hung here for 600 s
      // with the queue believing transfers were in flight.)
      io_uring_cqe* cqe = nullptr;
      __kernel_timespec slice{.tv_sec = 1, .tv_nsec = 0};
      int rc = io_uring_wait_cqe_timeout(&ring_, &cqe, &slice);
      if (rc == -ETIME) {
        waited_idle += absl::Seconds(slice.tv_sec);
        if (waited_idle >= next_report) {
          // A transfer the kernel never completes cannot be given up (its
          // buffer may still be written into); say so, with what the ring
          // holds, so a hang leaves evidence.
          Log(LogLevel::kWarning,
              absl::StrCat("io_uring: ", in_flight_, " transfer(s) in flight and none completed for ",
                           absl::FormatDuration(waited_idle), " (queued, not taken by the kernel: ",
                           io_uring_sq_ready(&ring_), "; completions ready: ",
                           io_uring_cq_ready(&ring_), "; ring flags 0x",
                           absl::Hex(IO_URING_READ_ONCE(*ring_.sq.kflags)), ")"));
          next_report *= 2;
        }
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
