#include "io/thread_io_queue.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <deque>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "io/posix_file.h"
#include "util/mutex.h"

namespace ckpt::internal {
namespace {

class ThreadIoQueue final : public IoQueue {
 public:
  explicit ThreadIoQueue(size_t depth) : depth_(depth) {
    size_t threads = std::min<size_t>(depth, 16);
    workers_.reserve(threads);
    for (size_t i = 0; i < threads; ++i) workers_.emplace_back([this] { Work(); });
  }

  ~ThreadIoQueue() override {
    {
      MutexLock lock(&mu_);
      // Let transfers already started finish: their buffers are the caller's.
      mu_.Await([this] { return pending_.empty() && running_ == 0; });
      stopping_ = true;
    }
    for (auto& t : workers_) t.join();
  }

  absl::string_view name() const override { return "threads"; }
  size_t depth() const override { return depth_; }

  absl::Status RegisterBuffers(std::span<const std::span<char>>) override {
    return absl::UnimplementedError("thread pool queue has no registered buffers");
  }

  absl::Status Submit(std::span<const IoOp> ops) override {
    MutexLock lock(&mu_);
    if (in_flight_ + ops.size() > depth_) {
      return absl::InternalError(absl::StrCat("thread queue over depth: ", in_flight_, " + ",
                                              ops.size(), " > ", depth_));
    }
    // Every op's descriptor first: an op this queue cannot run fails the
    // whole Submit before any starts.
    std::vector<Pending> resolved;
    resolved.reserve(ops.size());
    for (const IoOp& op : ops) {
      absl::StatusOr<int> fd = DescriptorFor(op.file, name());
      if (!fd.ok()) return fd.status();
      resolved.push_back(Pending{op, *fd});
    }
    pending_.insert(pending_.end(), resolved.begin(), resolved.end());
    in_flight_ += ops.size();
    return absl::OkStatus();
  }

  absl::Status Reap(size_t min_complete, std::vector<IoCompletion>* out) override {
    MutexLock lock(&mu_);
    min_complete = std::min(min_complete, in_flight_);
    mu_.Await([&] { return done_.size() >= min_complete; });
    in_flight_ -= done_.size();
    out->insert(out->end(), done_.begin(), done_.end());
    done_.clear();
    return absl::OkStatus();
  }

 private:
  void Work() {
    while (true) {
      Pending next;
      {
        MutexLock lock(&mu_);
        mu_.Await([this] { return stopping_ || !pending_.empty(); });
        if (pending_.empty()) return;
        next = pending_.front();
        pending_.pop_front();
        ++running_;
      }
      // One system call, reported as the kernel reported it: the caller
      // retries short transfers and EINTR.
      const IoOp& op = next.op;
      ssize_t n = op.kind == IoOp::Kind::kWrite
                      ? ::pwrite(next.fd, op.buf, op.length, static_cast<off_t>(op.offset))
                      : ::pread(next.fd, op.buf, op.length, static_cast<off_t>(op.offset));
      int64_t result = n >= 0 ? n : -errno;
      MutexLock lock(&mu_);
      --running_;
      done_.push_back(IoCompletion{op.tag, result});
    }
  }

  // An op waiting for a worker, with its file's descriptor.
  struct Pending {
    IoOp op;
    int fd = -1;
  };

  const size_t depth_;
  Mutex mu_;
  std::deque<Pending> pending_ ABSL_GUARDED_BY(mu_);
  std::vector<IoCompletion> done_ ABSL_GUARDED_BY(mu_);
  size_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  size_t running_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<IoQueue>> NewThreadIoQueue(size_t depth) {
  return std::make_unique<ThreadIoQueue>(depth);
}

}  // namespace ckpt::internal
