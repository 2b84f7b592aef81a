// IoExecutor's ownership contract, which every buffer pool above it relies
// on: a `Start` that fails started nothing (the caller keeps its buffer, the
// tag never comes back); a `Start` that succeeds reports its tag exactly once
// from `Poll`/`Drain`, when no part of it is in flight any more -- also when
// it failed after starting, or when an earlier transfer's failure cut it
// short. (A tag reported for a transfer whose `Start` failed made the
// persister give a staging chunk back twice: two later pieces of data then
// shared one chunk, and a checkpoint's checksums matched wrong bytes.)
#include <algorithm>
#include <cerrno>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "ckpt/file_system.h"
#include "gtest/gtest.h"
#include "io/io_executor.h"
#include "test_util.h"
#include "testing/fault_injection_file_system.h"

namespace ckpt {
namespace {

using internal::IoExecutor;
using testing::Fault;
using testing::FaultInjectionFileSystem;

class IoExecutorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fs_ = std::make_shared<FaultInjectionFileSystem>(PosixFileSystem());
    OpenOptions options;
    options.write = true;
    options.create = true;
    auto file = fs_->Open(scratch_.Join("f"), options);
    ASSERT_TRUE(file.ok()) << file.status();
    file_ = std::move(*file);
    buffer_.assign(1 << 20, 'x');
  }

  std::unique_ptr<IoQueue> Queue(size_t depth) {
    auto queue = fs_->NewIoQueue(IoQueueKind::kThreads, depth);
    EXPECT_TRUE(queue.ok()) << queue.status();
    return queue.ok() ? std::move(*queue) : nullptr;
  }

  testing::ScratchDir scratch_{"ckpt-io-executor"};
  std::shared_ptr<FaultInjectionFileSystem> fs_;
  std::unique_ptr<File> file_;
  std::vector<char> buffer_;
};

// How often each tag came back.
std::map<uint64_t, int> Count(const std::vector<uint64_t>& tags) {
  std::map<uint64_t, int> n;
  for (uint64_t t : tags) ++n[t];
  return n;
}

TEST_F(IoExecutorTest, CleanTransfersReportEachTagOnce) {
  auto queue = Queue(2);
  ASSERT_NE(queue, nullptr);
  IoExecutor io(queue.get(), 4096);
  for (uint64_t tag = 1; tag <= 5; ++tag) {
    ASSERT_TRUE(io.Start(IoOp::Kind::kWrite, file_.get(), tag * 16384, buffer_.data(), 3 * 4096, tag).ok());
  }
  std::vector<uint64_t> finished;
  ASSERT_TRUE(io.Drain(&finished).ok());
  EXPECT_EQ(Count(finished), (std::map<uint64_t, int>{{1, 1}, {2, 1}, {3, 1}, {4, 1}, {5, 1}}));
}

// The queue is full when transfer 3 starts; waiting for room reaps the
// failure of transfer 1. Transfer 3 must then not start (and say so), and
// 1 and 2 come back once each.
TEST_F(IoExecutorTest, StartThatMeetsAnEarlierFailureStartsNothing) {
  auto queue = Queue(2);
  ASSERT_NE(queue, nullptr);
  fs_->ResetCallCount();
  fs_->FailAt(1, Fault::kEio);  // the first op
  IoExecutor io(queue.get(), 1 << 20);
  ASSERT_TRUE(io.Start(IoOp::Kind::kWrite, file_.get(), 0, buffer_.data(), 4096, 1).ok());
  ASSERT_TRUE(io.Start(IoOp::Kind::kWrite, file_.get(), 4096, buffer_.data(), 4096, 2).ok());
  absl::Status third = io.Start(IoOp::Kind::kWrite, file_.get(), 8192, buffer_.data(), 4096, 3);
  EXPECT_FALSE(third.ok()) << "transfer 3 reported as started after transfer 1 failed";
  std::vector<uint64_t> finished;
  EXPECT_FALSE(io.Drain(&finished).ok());
  EXPECT_EQ(Count(finished), (std::map<uint64_t, int>{{1, 1}, {2, 1}}))
      << "transfer 3 did not start, so its tag must never come back";
}

// A transfer of three pieces through a queue of one: its first piece fails
// while the second waits for room. Part of it started, so `Start` is OK and
// its tag comes back exactly once.
TEST_F(IoExecutorTest, TransferCutShortAfterItStartedReportsItsTagOnce) {
  auto queue = Queue(1);
  ASSERT_NE(queue, nullptr);
  fs_->ResetCallCount();
  fs_->FailAt(1, Fault::kEio);
  IoExecutor io(queue.get(), 4096);
  EXPECT_TRUE(io.Start(IoOp::Kind::kWrite, file_.get(), 0, buffer_.data(), 3 * 4096, 7).ok());
  std::vector<uint64_t> finished;
  EXPECT_FALSE(io.Drain(&finished).ok());
  EXPECT_EQ(Count(finished), (std::map<uint64_t, int>{{7, 1}}));
}

// Retries pending when an error arrives are abandoned, but their transfer
// still reports its tag (its buffer is free again), once.
TEST_F(IoExecutorTest, AbandonedRetriesStillReportTheirTransfer) {
  auto queue = Queue(2);
  ASSERT_NE(queue, nullptr);
  fs_->ResetCallCount();
  fs_->FailAt(1, Fault::kEintr);  // transfer 1 must be retried...
  IoExecutor io(queue.get(), 1 << 20);
  ASSERT_TRUE(io.Start(IoOp::Kind::kWrite, file_.get(), 0, buffer_.data(), 4096, 1).ok());
  fs_->FailAt(2, Fault::kEio);  // ...and transfer 2 fails meanwhile
  ASSERT_TRUE(io.Start(IoOp::Kind::kWrite, file_.get(), 4096, buffer_.data(), 4096, 2).ok());
  std::vector<uint64_t> finished;
  (void)io.Drain(&finished);
  EXPECT_EQ(Count(finished), (std::map<uint64_t, int>{{1, 1}, {2, 1}}));
}

// A queue whose next `eagain` submitted ops complete with -EAGAIN without
// reaching `base` (what a kernel says when it could not start a transfer
// now); every later op goes through.
class EagainQueue final : public IoQueue {
 public:
  EagainQueue(std::unique_ptr<IoQueue> base, uint64_t eagain) : base_(std::move(base)), eagain_(eagain) {}
  absl::string_view name() const override { return base_->name(); }
  size_t depth() const override { return base_->depth(); }
  absl::Status RegisterBuffers(std::span<const std::span<char>> buffers) override {
    return base_->RegisterBuffers(buffers);
  }
  absl::Status Submit(std::span<const IoOp> ops) override {
    std::vector<IoOp> through;
    for (const IoOp& op : ops) {
      if (eagain_ > 0) {
        --eagain_;
        refused_.push_back({op.tag, -EAGAIN});
      } else {
        through.push_back(op);
      }
    }
    return through.empty() ? absl::OkStatus() : base_->Submit(through);
  }
  absl::Status Reap(size_t min_complete, std::vector<IoCompletion>* out) override {
    const size_t taken = refused_.size();
    out->insert(out->end(), refused_.begin(), refused_.end());
    refused_.clear();
    return base_->Reap(min_complete > taken ? min_complete - taken : 0, out);
  }
  uint64_t eagain_left() const { return eagain_; }

 private:
  const std::unique_ptr<IoQueue> base_;
  uint64_t eagain_;
  std::vector<IoCompletion> refused_;
};

// docs/failures.md: EAGAIN is retried, not reported -- the transfers land,
// whole, and each tag comes back once.
TEST_F(IoExecutorTest, EagainIsRetriedAndTheDataLands) {
  auto queue = std::make_unique<EagainQueue>(Queue(2), 25);
  EagainQueue* eagain = queue.get();
  for (size_t i = 0; i < buffer_.size(); ++i) buffer_[i] = static_cast<char>(i * 7 + 3);
  IoExecutor io(queue.get(), 4096);
  ASSERT_TRUE(io.Start(IoOp::Kind::kWrite, file_.get(), 0, buffer_.data(), 5 * 4096, 1).ok());
  ASSERT_TRUE(io.Start(IoOp::Kind::kWrite, file_.get(), 5 * 4096, buffer_.data() + 5 * 4096, 3 * 4096, 2).ok());
  std::vector<uint64_t> finished;
  ASSERT_TRUE(io.Drain(&finished).ok());
  EXPECT_EQ(eagain->eagain_left(), 0u);
  EXPECT_EQ(Count(finished), (std::map<uint64_t, int>{{1, 1}, {2, 1}}));
  std::vector<char> back(8 * 4096);
  auto read = file_->ReadAt(0, std::span<char>(back));
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(*read, back.size());
  EXPECT_TRUE(std::equal(back.begin(), back.end(), buffer_.begin()));
}

// A transfer refused with EAGAIN 10,000 times in a row is reported (with
// what it was), not spun on for ever.
TEST_F(IoExecutorTest, EagainWithoutEndIsReportedAfterTheRetryLimit) {
  auto queue = std::make_unique<EagainQueue>(Queue(1), uint64_t{1} << 40);
  IoExecutor io(queue.get(), 4096);
  ASSERT_TRUE(io.Start(IoOp::Kind::kWrite, file_.get(), 0, buffer_.data(), 4096, 9).ok());
  std::vector<uint64_t> finished;
  const absl::Status drained = io.Drain(&finished);
  EXPECT_FALSE(drained.ok());
  EXPECT_NE(drained.message().find("retries exhausted"), absl::string_view::npos) << drained;
  EXPECT_NE(drained.message().find("EAGAIN"), absl::string_view::npos) << drained;
  EXPECT_EQ(Count(finished), (std::map<uint64_t, int>{{9, 1}}));
}

}  // namespace
}  // namespace ckpt
