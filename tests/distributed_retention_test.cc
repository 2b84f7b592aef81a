// Retention (ckpt-retain's library) over a root of multi-rank checkpoints:
// one unit each, never compacted, no delta chain broken in ROOT or in the
// cold tier.
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "ckpt/catalog.h"
#include "ckpt/reader.h"
#include "distributed_ranks.h"
#include "gtest/gtest.h"
#include "retain/retention.h"
#include "test_util.h"

namespace ckpt {
namespace {

using testing::ExpectRankPart;
using testing::OwnedTensor;
using testing::RankState;
using testing::Ranks;
using testing::ScratchDir;
using testing::Step;

TEST(DistributedEngine, RetentionTreatsAMultiRankCheckpointAsOneUnitAndNeverBreaksItsChain) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  const std::string cold = dir.Join("cold");
  std::filesystem::create_directory(cold);
  EngineOptions options = testing::SmallChunks();
  options.delta.mode = DeltaOptions::Mode::kExact;
  // These tests are about chains of deltas: each against the one before.
  options.delta.base = DeltaOptions::Base::kChained;
  options.delta.max_restore_read_factor = 0;
  options.delta.full_every = 3;  // full: 1, 4; deltas: 2, 3, 5, 6
  std::map<int64_t, std::vector<std::vector<OwnedTensor>>> saved;
  {
    Ranks ranks(root, 2, options, absl::Seconds(20));
    std::vector<std::vector<OwnedTensor>> states = {RankState(0, 11), RankState(1, 11)};
    for (int64_t step = 1; step <= 6; ++step) {
      for (int r = 0; r < 2; ++r) Step(states[r], r, step);
      std::vector<absl::Status> outcome = ranks.Save({step, step}, states);
      for (int r = 0; r < 2; ++r) ASSERT_TRUE(outcome[r].ok()) << outcome[r];
      saved[step] = states;
    }
    ranks.CloseAll();
  }
  tools::RetentionPolicy policy;
  policy.keep_last = 1;
  policy.keep_every = 3;  // keeps 3 (a delta of 2, of 1) and 6 (of 5, of 4)
  policy.cold_dir = cold;
  auto actions = tools::RunRetention(root, policy);
  ASSERT_TRUE(actions.ok()) << actions.status();
  for (const tools::RetentionAction& a : *actions) EXPECT_TRUE(a.error.empty()) << a.name << ": " << a.error;
  // Nothing was compacted (multi-rank checkpoints are not): every kept
  // delta kept its chain, in ROOT or in the cold tier.
  auto hot = ListSteps(root);
  ASSERT_TRUE(hot.ok());
  EXPECT_EQ(*hot, (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  // (Nothing left: every step is a base of a kept delta.) Without
  // keep_every, what step 6's chain does not need moves to the cold tier.
  policy.keep_every = 0;
  actions = tools::RunRetention(root, policy);
  ASSERT_TRUE(actions.ok()) << actions.status();
  for (const tools::RetentionAction& a : *actions) EXPECT_TRUE(a.error.empty()) << a.name << ": " << a.error;
  hot = ListSteps(root);
  auto cold_steps = ListSteps(cold);
  ASSERT_TRUE(hot.ok() && cold_steps.ok());
  EXPECT_EQ(*hot, (std::vector<int64_t>{4, 5, 6}));
  EXPECT_EQ(*cold_steps, (std::vector<int64_t>{1, 2, 3}));
  for (int64_t step : *hot) {
    for (int r = 0; r < 2; ++r) ExpectRankPart(root, step, r, 2, saved[step][r]);
  }
  for (int64_t step : *cold_steps) {
    for (int r = 0; r < 2; ++r) ExpectRankPart(cold, step, r, 2, saved[step][r]);
  }
}

// Ranks that share no file system: each rank's directory holds its own copy
// of each step (the manifest and its part). Those are told apart from whole
// checkpoints: RankCopyOf names the rank, a reader says to read the bucket
// instead of calling every step damaged, and ckpt-retain refuses to act on
// one, removing nothing.
TEST(DistributedEngine, RanksOwnCopiesAreToldApartAndRetentionLeavesThemAlone) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  std::filesystem::create_directory(root);
  EngineOptions options = testing::SmallChunks();
  options.delta.mode = DeltaOptions::Mode::kExact;
  options.delta.full_every = 2;
  options.distributed.shared_root = false;
  {
    Ranks ranks(root, 2, options, absl::Seconds(20));
    std::vector<std::vector<OwnedTensor>> states = {RankState(0, 21), RankState(1, 21)};
    for (int64_t step = 1; step <= 3; ++step) {
      for (int r = 0; r < 2; ++r) Step(states[r], r, step);
      std::vector<absl::Status> outcome = ranks.Save({step, step}, states);
      for (int r = 0; r < 2; ++r) ASSERT_TRUE(outcome[r].ok()) << outcome[r];
    }
    ranks.CloseAll();
  }
  for (int r = 0; r < 2; ++r) {
    const std::string copy = Ranks::RankRoot(root, r);
    auto rank = RankCopyOf(copy);
    ASSERT_TRUE(rank.ok()) << rank.status();
    ASSERT_TRUE(rank->has_value()) << copy;
    EXPECT_EQ(**rank, r);
    for (std::optional<int64_t> step : {std::optional<int64_t>(), std::optional<int64_t>(2)}) {
      ReaderOptions read;
      read.step = step;
      read.rank = r;
      auto reader = Reader::Open(copy, read);
      ASSERT_FALSE(reader.ok());
      EXPECT_EQ(reader.status().code(), absl::StatusCode::kFailedPrecondition) << reader.status();
      EXPECT_TRUE(absl::StrContains(reader.status().message(), absl::StrCat("rank ", r, "'s own copy")))
          << reader.status();
      EXPECT_TRUE(absl::StrContains(reader.status().message(), "bucket")) << reader.status();
    }
    tools::RetentionPolicy policy;
    policy.keep_last = 1;
    auto actions = tools::RunRetention(copy, policy);
    ASSERT_FALSE(actions.ok());
    EXPECT_EQ(actions.status().code(), absl::StatusCode::kFailedPrecondition) << actions.status();
    EXPECT_TRUE(absl::StrContains(actions.status().message(), "s3://")) << actions.status();
    EXPECT_EQ(*ListSteps(copy), (std::vector<int64_t>{1, 2, 3})) << copy;
  }
  // Not a rank's copy: ROOT above them (no steps), a whole multi-rank
  // checkpoint, a single-process one.
  EXPECT_FALSE(RankCopyOf(root)->has_value());
  const std::string shared = dir.Join("shared");
  {
    EngineOptions whole = testing::SmallChunks();
    Ranks ranks(shared, 2, whole, absl::Seconds(20));
    std::vector<std::vector<OwnedTensor>> states = {RankState(0, 22), RankState(1, 22)};
    std::vector<absl::Status> outcome = ranks.Save({1, 1}, states);
    ASSERT_TRUE(outcome[0].ok() && outcome[1].ok());
    ranks.CloseAll();
  }
  EXPECT_FALSE(RankCopyOf(shared)->has_value());
  // ... nor when it lost rank 1's manifest (damage: rank 1's shards are there).
  std::filesystem::remove(std::filesystem::path(shared) / StepDirName(1) / "rank-00001.MANIFEST.json");
  EXPECT_FALSE(RankCopyOf(shared)->has_value());
  ReaderOptions damaged;
  damaged.rank = 0;
  auto reader = Reader::Open(shared, damaged);
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kDataLoss) << reader.status();
  const std::string single = dir.Join("single");
  {
    auto engine = Engine::Open(single, testing::SmallChunks());
    ASSERT_TRUE(engine.ok()) << engine.status();
    std::vector<OwnedTensor> state = RankState(0, 23);
    ASSERT_TRUE((*engine)->Save(1, testing::Views(state)).ok());
  }
  EXPECT_FALSE(RankCopyOf(single)->has_value());
}

}  // namespace
}  // namespace ckpt
