// `EngineOptions::stall_timeout`: a save that makes no progress is given up
// with DEADLINE_EXCEEDED, every waiter learns it at once, and nothing is
// committed or left behind once the stuck call returns.
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "ckpt/catalog.h"
#include "ckpt/engine.h"
#include "gtest/gtest.h"
#include "test_util.h"
#include "testing/fault_injection_file_system.h"

namespace ckpt {
namespace {

using testing::Leftovers;
using testing::FaultInjectionFileSystem;
using testing::OwnedTensor;
using testing::RandomTensor;
using testing::ScratchDir;
using testing::Views;

constexpr absl::Duration kDeadline = absl::Seconds(30);

std::vector<OwnedTensor> State(uint64_t seed) {
  std::vector<OwnedTensor> state;
  for (int l = 0; l < 4; ++l) {
    state.push_back(RandomTensor(absl::StrCat("layers.", l, ".weight"), DType::kFloat32,
                                 {256, 256}, seed * 10 + l));
  }
  return state;
}

class StallTimeoutTest : public ::testing::Test {
 protected:
  void Open(EngineOptions options) {
    fs_ = std::make_shared<FaultInjectionFileSystem>(PosixFileSystem());
    options.fs = fs_;
    options.watchdog_timeout = absl::Milliseconds(200);
    options.stall_timeout = absl::Seconds(1);
    auto engine = Engine::Open(root(), options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(*engine);
    // A committed checkpoint that must survive everything below.
    ASSERT_TRUE(engine_->Save(1, Views(state_)).ok());
  }
  std::string root() const { return dir_.Join("root"); }

  // Releases the "disk" and checks that the stalled save left nothing.
  void ExpectNothingLeftAfterRelease(int64_t stalled_step) {
    fs_->HoldIo(false);
    (void)engine_->Close(Engine::CloseMode::kWait);
    EXPECT_TRUE(Leftovers(root()).empty()) << Leftovers(root())[0];
    auto steps = ListCheckpoints(root());
    ASSERT_TRUE(steps.ok());
    for (const auto& c : *steps) EXPECT_NE(c.step, stalled_step);
    testing::ExpectCheckpointEquals(root(), 1, state_);
    // The root takes new saves.
    auto again = Engine::Open(root(), EngineOptions());
    ASSERT_TRUE(again.ok());
    ASSERT_TRUE((*again)->Save(stalled_step, Views(state_)).ok());
  }

  // Saves `step` on a hung disk and waits (without `Wait`, which would
  // report the error) until the watchdog gave it up; then the disk recovers.
  void StallAndGiveUpUnobserved(int64_t step) {
    fs_->HoldIo(true);
    auto handle = engine_->SaveAsync(step, Views(state_));
    ASSERT_TRUE(handle.ok());
    testing::RunOrDie(
        [&] {
          while (!(*handle)->Done()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
        },
        kDeadline, "the stalled save to be given up");
    fs_->HoldIo(false);
  }

  ScratchDir dir_;
  std::vector<OwnedTensor> state_ = State(1);
  std::shared_ptr<FaultInjectionFileSystem> fs_;
  std::unique_ptr<Engine> engine_;
};

TEST_F(StallTimeoutTest, WaitFailsWithDeadlineExceededWhileTheDiskHangs) {
  Open(testing::SmallChunks());
  fs_->HoldIo(true);
  auto handle = engine_->SaveAsync(2, Views(state_));
  ASSERT_TRUE(handle.ok()) << handle.status();
  const absl::Time start = absl::Now();
  absl::Status waited = testing::WaitOrDie(**handle, kDeadline, "Wait of a stalled save");
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_EQ(waited.code(), absl::StatusCode::kDeadlineExceeded) << waited;
  EXPECT_NE(waited.message().find("step 2"), std::string::npos) << waited;
  EXPECT_NE(waited.message().find("writing"), std::string::npos) << waited;
  EXPECT_TRUE((*handle)->Done());
  EXPECT_GE(fs_->io_held_waiters(), 1u);  // the persister is still stuck
  EXPECT_EQ(engine_->stats().saves_given_up, 1u);
  EXPECT_GE(engine_->stats().watchdog_stalls, 1u);  // the warning came first
  ExpectNothingLeftAfterRelease(2);
}

TEST_F(StallTimeoutTest, LazySaveIsStagedButFails) {
  EngineOptions options = testing::SmallChunks();
  options.lazy_staging = true;
  Open(options);
  fs_->HoldIo(true);
  auto handle = engine_->SaveAsync(2, Views(state_));
  ASSERT_TRUE(handle.ok());
  EXPECT_TRUE(testing::WaitStagedOrDie(**handle, kDeadline, "WaitStaged").ok());
  absl::Status waited = testing::WaitOrDie(**handle, kDeadline, "Wait of a stalled lazy save");
  EXPECT_EQ(waited.code(), absl::StatusCode::kDeadlineExceeded) << waited;
  ExpectNothingLeftAfterRelease(2);
}

// Staging memory smaller than the save: the caller is blocked inside
// SaveAsync waiting for chunks the stuck persister holds.
TEST_F(StallTimeoutTest, CallerBlockedOnStagingMemoryIsReleased) {
  EngineOptions options = testing::SmallChunks();
  options.staging_bytes = 2 * options.io.chunk_bytes;
  Open(options);
  fs_->HoldIo(true);
  std::shared_ptr<SaveHandle> handle;
  testing::RunOrDie(
      [&] {
        auto h = engine_->SaveAsync(2, Views(state_));
        ASSERT_TRUE(h.ok()) << h.status();
        handle = *h;
      },
      kDeadline, "SaveAsync blocked on staging memory");
  ASSERT_NE(handle, nullptr);
  absl::Status staged = testing::WaitStagedOrDie(*handle, kDeadline, "WaitStaged");
  EXPECT_EQ(staged.code(), absl::StatusCode::kDeadlineExceeded) << staged;
  EXPECT_EQ(testing::WaitOrDie(*handle, kDeadline, "Wait").code(),
            absl::StatusCode::kDeadlineExceeded);
  ExpectNothingLeftAfterRelease(2);
}

TEST_F(StallTimeoutTest, UnobservedGiveUpIsReportedByTheNextSave) {
  Open(testing::SmallChunks());
  StallAndGiveUpUnobserved(2);
  auto next = engine_->SaveAsync(3, Views(state_));
  ASSERT_FALSE(next.ok());
  EXPECT_EQ(next.status().code(), absl::StatusCode::kDeadlineExceeded) << next.status();
  // Reported once: the save after it goes through.
  auto retry = engine_->SaveAsync(3, Views(state_));
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_TRUE(testing::WaitOrDie(**retry, kDeadline, "save after a given-up save").ok());
  EXPECT_TRUE(engine_->Close(Engine::CloseMode::kWait).ok());
  testing::ExpectCheckpointEquals(root(), 3, state_);
  EXPECT_TRUE(Leftovers(root()).empty());
}

TEST_F(StallTimeoutTest, CloseReportsAnUnobservedGiveUp) {
  Open(testing::SmallChunks());
  StallAndGiveUpUnobserved(2);
  absl::Status closed;
  testing::RunOrDie([&] { closed = engine_->Close(Engine::CloseMode::kWait); }, kDeadline,
                    "Close after a given-up save");
  EXPECT_EQ(closed.code(), absl::StatusCode::kDeadlineExceeded) << closed;
  EXPECT_TRUE(Leftovers(root()).empty());
}

// A slow disk that keeps making progress is never given up.
TEST_F(StallTimeoutTest, SlowButMovingSaveIsNotGivenUp) {
  Open(testing::SmallChunks());
  // 16 writes of 64 KiB, 100 ms each: 1.6 s in all, longer than the stall
  // timeout, but never 1 s without progress.
  fs_->SetIoDelay(absl::Milliseconds(100));
  auto handle = engine_->SaveAsync(2, Views(state_));
  ASSERT_TRUE(handle.ok());
  EXPECT_TRUE(testing::WaitOrDie(**handle, kDeadline, "slow save").ok());
  EXPECT_EQ(engine_->stats().saves_given_up, 0u);
}

}  // namespace
}  // namespace ckpt
