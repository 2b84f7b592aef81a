#include "testing/fault_injection_io.h"

#include <cerrno>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "util/mutex.h"
#include "util/status_macros.h"

namespace ckpt::testing::fault_internal {
namespace {

// "ReadAt /f@4096+100": how recorded calls and fault messages name a
// synchronous transfer (as "IoOp write /f@4096+65536" names a queued one).
std::string DescribeAt(absl::string_view call, const std::string& path, uint64_t offset,
                       size_t length) {
  return absl::StrCat(call, " ", path, "@", offset, "+", length);
}

class FaultFile final : public File {
 public:
  FaultFile(std::shared_ptr<State> state, std::unique_ptr<File> base,
            std::shared_ptr<TrackedFile> tracked)
      : state_(std::move(state)), base_(std::move(base)), tracked_(std::move(tracked)) {}

  File* base() const { return base_.get(); }

  const std::string& path() const override { return base_->path(); }
  bool direct() const override { return base_->direct(); }

  // A File retries short transfers and EINTR itself, so those faults stay
  // inside the call: a short transfer moves its bytes in two base calls (the
  // short part, then the rest), an EINTR is retried at once.
  absl::StatusOr<size_t> ReadAt(uint64_t offset, std::span<char> out) override {
    size_t part = 0;
    CKPT_RETURN_IF_ERROR(StartTransfer("ReadAt", offset, out.size(), &part));
    if (part == 0) return base_->ReadAt(offset, out);
    CKPT_ASSIGN_OR_RETURN(size_t first, base_->ReadAt(offset, out.first(part)));
    if (first < part) return first;  // the file ended inside the short part
    CKPT_ASSIGN_OR_RETURN(size_t rest, base_->ReadAt(offset + part, out.subspan(part)));
    return part + rest;
  }

  absl::Status WriteAt(uint64_t offset, std::span<const char> data) override {
    size_t part = 0;
    CKPT_RETURN_IF_ERROR(StartTransfer("WriteAt", offset, data.size(), &part));
    if (part == 0) return base_->WriteAt(offset, data);
    CKPT_RETURN_IF_ERROR(base_->WriteAt(offset, data.first(part)));
    return base_->WriteAt(offset + part, data.subspan(part));
  }

  absl::Status Sync() override {
    CKPT_FAULT_CHECK(*state_, absl::StrCat("fsync ", path()));
    absl::Status status = base_->Sync();
    if (!status.ok() || tracked_ == nullptr) return status;
    absl::StatusOr<uint64_t> size = base_->Size();
    if (!size.ok()) return size.status();
    internal::MutexLock lock(&state_->mu_);
    state_->log_.FileSynced(*tracked_, *size);
    return absl::OkStatus();
  }

  absl::Status Truncate(uint64_t size) override {
    CKPT_FAULT_CHECK(*state_, absl::StrCat("ftruncate ", path(), " to ", size));
    return base_->Truncate(size);
  }

  absl::Status Allocate(uint64_t size) override {
    CKPT_FAULT_CHECK(*state_, absl::StrCat("fallocate ", path(), " to ", size));
    return base_->Allocate(size);
  }

  absl::StatusOr<uint64_t> Size() override {
    CKPT_FAULT_CHECK(*state_, absl::StrCat("fstat ", path()));
    return base_->Size();
  }

  absl::Status DropCache() override {
    CKPT_FAULT_CHECK(*state_, absl::StrCat("posix_fadvise ", path()));
    return base_->DropCache();
  }

  absl::Status Close() override {
    absl::Status fault = Check(*state_, absl::StrCat("close ", path()));
    if (!fault.ok()) {
      // close(2) releases the descriptor even when it fails; so does a crash.
      (void)base_->Close();
      return fault;
    }
    return base_->Close();
  }

 private:
  // Waits as the "disk" says, counts one transfer of `length` bytes at
  // `offset` and returns the status it fails with (kEio, kEnospc, kCrash:
  // nothing reaches the base). `*part` becomes the length of the short part
  // for kShortTransfer (0 where none exists, or for any other fault).
  absl::Status StartTransfer(absl::string_view call, uint64_t offset, size_t length,
                             size_t* part) {
    state_->BeforeTransfers(1);
    const std::string what = DescribeAt(call, path(), offset, length);
    const Fault fault = state_->OnCall(/*transfer=*/true, [&] { return what; });
    *part = fault == Fault::kShortTransfer ? ShortLength(length, direct()) : 0;
    return FaultStatus(fault, what);
  }

  const std::shared_ptr<State> state_;
  const std::unique_ptr<File> base_;
  const std::shared_ptr<TrackedFile> tracked_;  // null unless opened for writing
};

class FaultIoQueue final : public IoQueue {
 public:
  FaultIoQueue(std::shared_ptr<State> state, std::unique_ptr<IoQueue> base)
      : state_(std::move(state)), base_(std::move(base)) {}

  absl::string_view name() const override { return base_->name(); }
  size_t depth() const override { return base_->depth(); }
  absl::Status RegisterBuffers(std::span<const std::span<char>> buffers) override {
    return base_->RegisterBuffers(buffers);
  }

  absl::Status Submit(std::span<const IoOp> ops) override {
    state_->BeforeTransfers(ops.size());
    std::vector<IoOp> base_ops;
    std::vector<IoCompletion> injected;
    base_ops.reserve(ops.size());
    for (const IoOp& op : ops) {
      IoOp base_op = op;
      if (auto* file = dynamic_cast<FaultFile*>(op.file)) base_op.file = file->base();
      Fault fault = state_->OnCall(/*transfer=*/true, [&] { return Describe(op); });
      if (fault == Fault::kShortTransfer) {
        base_op.length = op.file != nullptr
                             ? static_cast<uint32_t>(ShortLength(op.length, op.file->direct()))
                             : 0;
        if (base_op.length == 0) fault = Fault::kEintr;
      }
      switch (fault) {
        case Fault::kNone:
        case Fault::kShortTransfer: base_ops.push_back(base_op); break;
        case Fault::kEio:
        case Fault::kCrash: injected.push_back({op.tag, -EIO}); break;
        case Fault::kEnospc: injected.push_back({op.tag, -ENOSPC}); break;
        case Fault::kEintr: injected.push_back({op.tag, -EINTR}); break;
      }
    }
    if (!base_ops.empty()) {
      absl::Status status = base_->Submit(base_ops);
      if (!status.ok()) return status;
    }
    internal::MutexLock lock(&mu_);
    injected_.insert(injected_.end(), injected.begin(), injected.end());
    return absl::OkStatus();
  }

  absl::Status Reap(size_t min_complete, std::vector<IoCompletion>* out) override {
    size_t taken;
    {
      internal::MutexLock lock(&mu_);
      taken = injected_.size();
      out->insert(out->end(), injected_.begin(), injected_.end());
      injected_.clear();
    }
    return base_->Reap(min_complete > taken ? min_complete - taken : 0, out);
  }

 private:
  static std::string Describe(const IoOp& op) {
    return absl::StrCat("IoOp ", op.kind == IoOp::Kind::kWrite ? "write " : "read ",
                        op.file != nullptr ? op.file->path() : "(null file)", "@", op.offset,
                        "+", op.length);
  }

  const std::shared_ptr<State> state_;
  const std::unique_ptr<IoQueue> base_;
  internal::Mutex mu_;
  // Completions of ops that failed by injection, returned by the next `Reap`.
  std::vector<IoCompletion> injected_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<File> NewFaultFile(std::shared_ptr<State> state, std::unique_ptr<File> base,
                                   std::shared_ptr<TrackedFile> tracked) {
  return std::make_unique<FaultFile>(std::move(state), std::move(base), std::move(tracked));
}

std::unique_ptr<IoQueue> NewFaultIoQueue(std::shared_ptr<State> state,
                                         std::unique_ptr<IoQueue> base) {
  return std::make_unique<FaultIoQueue>(std::move(state), std::move(base));
}

}  // namespace ckpt::testing::fault_internal
