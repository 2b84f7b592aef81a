// The retention/tiering job: keeps what its rules say plus every base a kept
// delta needs, removes or moves the rest, and is safe beside a writer.
#include "retention.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <random>
#include <thread>

#include "ckpt/catalog.h"
#include "ckpt/engine.h"
#include "ckpt/reader.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace ckpt {
namespace {

using testing::OwnedTensor;
using testing::RandomTensor;
using testing::ScratchDir;
using testing::Views;
using tools::RetentionPolicy;
using tools::RunRetention;

EngineOptions DeltaEvery(int full_every) {
  EngineOptions options = testing::SmallChunks();
  options.delta.mode = DeltaOptions::Mode::kExact;
  options.delta.full_every = full_every;
  return options;
}

void Mutate(OwnedTensor& t, std::mt19937_64& rng) {
  for (int i = 0; i < 50; ++i) t.bytes[rng() % t.bytes.size()] ^= 0x5A;
}

void ExpectEveryStepRestores(const std::string& root) {
  auto steps = ListSteps(root);
  ASSERT_TRUE(steps.ok());
  for (int64_t step : *steps) {
    ReaderOptions options;
    options.step = step;
    auto reader = Reader::Open(root, options);
    ASSERT_TRUE(reader.ok()) << "step " << step << ": " << reader.status();
    EXPECT_TRUE((*reader)->Verify().ok()) << "step " << step;
  }
}

TEST(RetentionTest, KeepsBasesOfKeptDeltasAndRemovesTheRest) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  auto engine = Engine::Open(root, DeltaEvery(5));
  ASSERT_TRUE(engine.ok());
  std::vector<OwnedTensor> state = {RandomTensor("m.w", DType::kFloat32, {4096}, 1)};
  std::mt19937_64 rng(1);
  for (int step = 1; step <= 13; ++step) {  // full: 1, 6, 11; the rest deltas
    Mutate(state[0], rng);
    ASSERT_TRUE((*engine)->Save(step, Views(state)).ok());
  }
  RetentionPolicy policy;
  policy.keep_last = 1;  // 13, a delta of 12 of 11
  policy.dry_run = true;
  auto plan = RunRetention(root, policy);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(*ListSteps(root), (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13}));
  policy.dry_run = false;
  ASSERT_TRUE(RunRetention(root, policy).ok());
  EXPECT_EQ(*ListSteps(root), (std::vector<int64_t>{11, 12, 13}));
  ExpectEveryStepRestores(root);
  auto latest = Reader::Open(root, ReaderOptions{});
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ((*latest)->step(), 13);
}

TEST(RetentionTest, KeepEveryAndColdTierMoveVerifiedCopies) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  const std::string cold = dir.Join("cold");
  std::filesystem::create_directory(cold);
  auto engine = Engine::Open(root, EngineOptions{});
  ASSERT_TRUE(engine.ok());
  std::vector<OwnedTensor> state = {RandomTensor("m.w", DType::kFloat32, {4096}, 1)};
  for (int step = 1; step <= 6; ++step) ASSERT_TRUE((*engine)->Save(step * 100, Views(state)).ok());
  RetentionPolicy policy;
  policy.keep_last = 1;
  policy.keep_every = 200;
  policy.cold_dir = cold;
  auto actions = RunRetention(root, policy);
  ASSERT_TRUE(actions.ok()) << actions.status();
  EXPECT_EQ(*ListSteps(root), (std::vector<int64_t>{200, 400, 600}));
  EXPECT_EQ(*ListSteps(cold), (std::vector<int64_t>{100, 300, 500}));
  ExpectEveryStepRestores(cold);
  for (const auto& name : std::filesystem::directory_iterator(root)) {
    EXPECT_FALSE(name.path().filename().string().starts_with(".trash-")) << name.path();
  }
}

TEST(RetentionTest, BadInputIsAClearErrorAndChangesNothing) {
  ScratchDir dir;
  RetentionPolicy policy;
  policy.keep_last = 1;
  EXPECT_EQ(RunRetention(dir.Join("missing"), policy).status().code(), absl::StatusCode::kNotFound);
  std::filesystem::create_directory(dir.Join("empty"));
  EXPECT_EQ(RunRetention(dir.Join("empty"), policy).status().code(),
            absl::StatusCode::kFailedPrecondition);
  const std::string root = dir.Join("root");
  auto engine = Engine::Open(root, EngineOptions{});
  std::vector<OwnedTensor> state = {RandomTensor("m.w", DType::kFloat32, {16}, 1)};
  ASSERT_TRUE((*engine)->Save(1, Views(state)).ok());
  ASSERT_TRUE((*engine)->Save(2, Views(state)).ok());
  policy.cold_dir = root;
  auto same = RunRetention(root, policy);
  EXPECT_EQ(same.status().code(), absl::StatusCode::kInvalidArgument) << same.status();
  policy.cold_dir = root + "/" + StepDirName(1);
  EXPECT_EQ(RunRetention(root, policy).status().code(), absl::StatusCode::kInvalidArgument);
  policy.cold_dir = dir.Join("no-such-cold");
  EXPECT_EQ(RunRetention(root, policy).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(*ListSteps(root), (std::vector<int64_t>{1, 2}));
}

TEST(RetentionTest, AnotherRunningJobIsRefused) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  auto engine = Engine::Open(root, EngineOptions{});
  std::vector<OwnedTensor> state = {RandomTensor("m.w", DType::kFloat32, {16}, 1)};
  ASSERT_TRUE((*engine)->Save(1, Views(state)).ok());
  int fd = ::open((root + "/.ckpt-retain.lock").c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);
  RetentionPolicy policy;
  policy.keep_last = 1;
  EXPECT_EQ(RunRetention(root, policy).status().code(), absl::StatusCode::kUnavailable);
  ::close(fd);
  EXPECT_TRUE(RunRetention(root, policy).ok());
}

TEST(RetentionTest, StaleTempDirsGoAndFreshOnesStay) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  auto engine = Engine::Open(root, EngineOptions{});
  std::vector<OwnedTensor> state = {RandomTensor("m.w", DType::kFloat32, {16}, 1)};
  ASSERT_TRUE((*engine)->Save(1, Views(state)).ok());
  std::filesystem::create_directory(root + "/.tmp-step-00000000000000000009-old");
  std::filesystem::last_write_time(root + "/.tmp-step-00000000000000000009-old",
                                   std::filesystem::file_time_type::clock::now() - std::chrono::hours(3));
  std::filesystem::create_directory(root + "/.tmp-step-00000000000000000010-new");
  RetentionPolicy policy;
  policy.keep_last = 5;
  ASSERT_TRUE(RunRetention(root, policy).ok());
  EXPECT_FALSE(std::filesystem::exists(root + "/.tmp-step-00000000000000000009-old"));
  EXPECT_TRUE(std::filesystem::exists(root + "/.tmp-step-00000000000000000010-new"));
}

// A writer saving deltas and the job running in a loop beside it: no delta
// ever loses its base, the newest checkpoint always opens, and afterwards
// every remaining checkpoint restores.
TEST(RetentionTest, SafeBesideAWriter) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  std::atomic<bool> done{false};
  std::atomic<int> saves{0};
  std::thread writer([&] {
    auto engine = Engine::Open(root, DeltaEvery(4));
    ASSERT_TRUE(engine.ok());
    std::vector<OwnedTensor> state = {RandomTensor("a.w", DType::kFloat32, {20000}, 1),
                                      RandomTensor("b.w", DType::kBFloat16, {3000}, 2)};
    std::mt19937_64 rng(3);
    for (int step = 1; step <= 40; ++step) {
      for (auto& t : state) Mutate(t, rng);
      auto stats = (*engine)->Save(step, Views(state));
      ASSERT_TRUE(stats.ok()) << stats.status();
      ++saves;
    }
    done = true;
  });
  RetentionPolicy policy;
  policy.keep_last = 3;
  policy.stale_temp_age = absl::Seconds(30);
  int runs = 0;
  while (!done) {
    auto actions = RunRetention(root, policy);
    if (actions.ok()) {
      ++runs;
      for (const auto& a : *actions) EXPECT_TRUE(a.error.empty()) << a.name << ": " << a.error;
    } else {
      EXPECT_TRUE(absl::IsFailedPrecondition(actions.status()) || absl::IsNotFound(actions.status()))
          << actions.status();  // before the first save
    }
    if (saves > 0) {
      auto latest = Reader::Open(root, ReaderOptions{});
      EXPECT_TRUE(latest.ok()) << latest.status();
    }
  }
  writer.join();
  EXPECT_GT(runs, 0);
  ASSERT_TRUE(RunRetention(root, policy).ok());
  ExpectEveryStepRestores(root);
  auto latest = Reader::Open(root, ReaderOptions{});
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ((*latest)->step(), 40);
}

}  // namespace
}  // namespace ckpt
