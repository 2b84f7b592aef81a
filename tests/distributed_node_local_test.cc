// Multi-rank checkpoints of ranks that share no file system
// (`DistributedOptions::shared_root = false`): each rank opens a directory of
// its own, rank 0 builds the checkpoint's manifest from the manifests the
// ranks sent through the store, and every rank commits a copy of its step
// holding that manifest and its own part only. The union of the ranks'
// copies (what a bucket holds once every rank published its part) is the
// checkpoint, bit-exact; a rank's own copy lets it take deltas after a
// restart; a failing rank aborts the save on every rank and leaves no
// temp directory anywhere.
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "ckpt/catalog.h"
#include "ckpt/distributed.h"
#include "ckpt/engine.h"
#include "ckpt/reader.h"
#include "distributed_ranks.h"
#include "gtest/gtest.h"
#include "test_util.h"
#include "testing/fault_injection_file_system.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;
using testing::ExpectRankPart;
using testing::OwnedTensor;
using testing::Ranks;
using testing::RankState;
using testing::ScratchDir;
using testing::Step;

EngineOptions NodeLocal() {
  EngineOptions options = testing::SmallChunks();
  options.distributed.shared_root = false;
  return options;
}

std::string Slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The names in `dir` (files and directories).
std::set<std::string> Names(const fs::path& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  return names;
}

TEST(NodeLocalRanks, EveryRankCommitsItsPartAndTheManifestAndTheirUnionIsTheCheckpoint) {
  constexpr int kWorld = 3;
  ScratchDir dir;
  const std::string root = dir.Join("root");
  fs::create_directories(root);
  EngineOptions options = NodeLocal();
  options.delta.mode = DeltaOptions::Mode::kExact;
  options.delta.full_every = 3;
  std::vector<std::vector<OwnedTensor>> states;
  for (int r = 0; r < kWorld; ++r) states.push_back(RankState(r, 11));
  std::map<int64_t, std::vector<std::vector<OwnedTensor>>> saved;
  {
    Ranks ranks(root, kWorld, options, absl::Seconds(20));
    for (int64_t step = 1; step <= 4; ++step) {
      for (int r = 0; r < kWorld; ++r) Step(states[r], r, step);
      std::vector<absl::Status> outcome = ranks.Save(std::vector<int64_t>(kWorld, step), states);
      for (int r = 0; r < kWorld; ++r) ASSERT_TRUE(outcome[r].ok()) << "rank " << r << ": " << outcome[r];
      saved[step] = states;
    }
    ranks.CloseAll();
  }
  for (int64_t step = 1; step <= 4; ++step) {
    const std::string name = StepDirName(step);
    const std::string manifest = Slurp(fs::path(Ranks::RankRoot(root, 0)) / name / "MANIFEST.json");
    ASSERT_FALSE(manifest.empty()) << name;
    for (int r = 0; r < kWorld; ++r) {
      const fs::path copy = fs::path(Ranks::RankRoot(root, r)) / name;
      // The same manifest on every rank, and this rank's files only.
      EXPECT_EQ(Slurp(copy / "MANIFEST.json"), manifest) << "rank " << r << " " << name;
      for (const std::string& f : Names(copy)) {
        EXPECT_TRUE(f == "MANIFEST.json" || absl::StartsWith(f, absl::StrCat("rank-0000", r, ".")))
            << "rank " << r << "'s copy of " << name << " holds " << f;
      }
    }
  }
  for (int r = 0; r < kWorld; ++r) {
    for (const std::string& f : Names(Ranks::RankRoot(root, r))) {
      EXPECT_FALSE(absl::StartsWith(f, ".tmp-step-")) << "rank " << r << " left " << f;
    }
  }
  // The union is the checkpoint: every rank's part of every step (deltas
  // resolved against the merged full step) bit-exact, and it verifies.
  const std::string merged = dir.Join("merged");
  testing::MergeRankCopies(root, kWorld, merged);
  auto summaries = ListCheckpoints(merged);
  ASSERT_TRUE(summaries.ok()) << summaries.status();
  ASSERT_EQ(summaries->size(), 4u);
  for (const CheckpointSummary& s : *summaries) {
    ASSERT_TRUE(s.manifest_status.ok()) << s.manifest_status;
    EXPECT_EQ(s.world_size, kWorld);
    EXPECT_EQ(s.kind, s.step == 1 || s.step == 4 ? CheckpointKind::kFull : CheckpointKind::kDelta) << s.step;
  }
  for (const auto& [step, per_rank] : saved) {
    for (int r = 0; r < kWorld; ++r) ExpectRankPart(merged, step, r, kWorld, per_rank[r]);
  }
  // One rank's copy alone is not a checkpoint: a reader says what it is,
  // where the checkpoint is, and what is missing here; and ROOT itself says
  // where the checkpoint is.
  auto alone = Reader::Open(Ranks::RankRoot(root, 1), ReaderOptions{});
  ASSERT_TRUE(absl::IsFailedPrecondition(alone.status())) << alone.status();
  EXPECT_TRUE(absl::StrContains(alone.status().message(), "rank 1's own copy")) << alone.status();
  EXPECT_TRUE(absl::StrContains(alone.status().message(), "whole only in the bucket")) << alone.status();
  EXPECT_TRUE(absl::StrContains(alone.status().message(), "rank 0's part")) << alone.status();
  auto above = Reader::Open(root, ReaderOptions{});
  ASSERT_TRUE(absl::IsNotFound(above.status())) << above.status();
  EXPECT_TRUE(absl::StrContains(above.status().message(), "whole only in the bucket")) << above.status();

  // Reopened (a restart), every rank rebuilds its delta reference from its
  // own copy, so the next save is a delta again, and it restores bit-exact.
  {
    Ranks ranks(root, kWorld, options, absl::Seconds(20));
    for (int r = 0; r < kWorld; ++r) Step(states[r], r, 5);
    std::vector<absl::Status> outcome = ranks.Save(std::vector<int64_t>(kWorld, 5), states);
    for (int r = 0; r < kWorld; ++r) ASSERT_TRUE(outcome[r].ok()) << "rank " << r << ": " << outcome[r];
    for (int r = 0; r < kWorld; ++r) {
      EXPECT_EQ(ranks.engine(r).stats().last.kind, CheckpointKind::kDelta) << "rank " << r;
    }
    ranks.CloseAll();
  }
  fs::remove_all(merged);
  testing::MergeRankCopies(root, kWorld, merged);
  for (int r = 0; r < kWorld; ++r) ExpectRankPart(merged, 5, r, kWorld, states[r]);
}

TEST(NodeLocalRanks, ARankWhoseWritesFailAbortsEveryRankAndLeavesNoTempDirectory) {
  constexpr int kWorld = 2;
  ScratchDir dir;
  const std::string root = dir.Join("root");
  fs::create_directories(root);
  auto faulty = std::make_shared<testing::FaultInjectionFileSystem>(PosixFileSystem());
  Ranks ranks(root, kWorld, NodeLocal(), absl::Seconds(20),
              [&](int r) -> std::shared_ptr<FileSystem> { return r == 1 ? faulty : nullptr; });
  std::vector<std::vector<OwnedTensor>> states = {RankState(0, 5), RankState(1, 5)};
  faulty->FailAt(faulty->call_count() + 6, testing::Fault::kEio);
  std::vector<absl::Status> outcome = ranks.Save({1, 1}, states);
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_FALSE(outcome[r].ok()) << "rank " << r;
    EXPECT_TRUE(absl::StrContains(outcome[r].message(), "EIO") ||
                absl::StrContains(outcome[r].message(), "rank 1 failed"))
        << "rank " << r << ": " << outcome[r];
  }
  EXPECT_TRUE(absl::StrContains(outcome[0].message(), "rank 1 failed")) << outcome[0];
  for (int r = 0; r < kWorld; ++r) {
    for (const std::string& f : Names(Ranks::RankRoot(root, r))) {
      EXPECT_FALSE(absl::StartsWith(f, ".tmp-step-") || absl::StartsWith(f, "step-"))
          << "rank " << r << " left " << f;
    }
  }
  // The engines go on: the next save commits on both.
  faulty->ClearFaults();
  outcome = ranks.Save({2, 2}, states);
  for (int r = 0; r < kWorld; ++r) EXPECT_TRUE(outcome[r].ok()) << "rank " << r << ": " << outcome[r];
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_TRUE(fs::exists(fs::path(Ranks::RankRoot(root, r)) / StepDirName(2))) << "rank " << r;
  }
  ranks.CloseAll();
}

// Rank 1 opens another directory than rank 0's: refused at open with what
// to do, whether it says the ranks share ROOT (the default) or, unlike rank
// 0, that they do not.
TEST(NodeLocalRanks, OpenRefusesRanksThatDisagreeOrDoNotShareRootSayingWhatToDo) {
  for (const bool rank1_shares_root : {true, false}) {
    ScratchDir dir;
    EngineOptions options = testing::RankOptions(NewInProcessStore(), 2, 0);
    auto zero = Engine::Open(dir.Join("a"), options);
    ASSERT_TRUE(zero.ok()) << zero.status();
    options.distributed.rank = 1;
    options.distributed.shared_root = rank1_shares_root;
    auto one = Engine::Open(dir.Join("b"), options);
    if (rank1_shares_root) {
      ASSERT_TRUE(absl::IsFailedPrecondition(one.status())) << one.status();
      EXPECT_TRUE(absl::StrContains(one.status().message(), "shared_root = false")) << one.status();
    } else {
      ASSERT_TRUE(absl::IsInvalidArgument(one.status())) << one.status();
      EXPECT_TRUE(absl::StrContains(one.status().message(), "shared_root false, rank 0 with true"))
          << one.status();
    }
  }
}

}  // namespace
}  // namespace ckpt
