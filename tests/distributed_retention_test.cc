// Retention (ckpt-retain's library) over a root of multi-rank checkpoints:
// one unit each, never compacted, no delta chain broken in ROOT or in the
// cold tier.
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "ckpt/catalog.h"
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

}  // namespace
}  // namespace ckpt
