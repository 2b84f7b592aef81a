// (Over 400 lines: one suite of the multi-rank engine's cases, each short;
// the shared ranks-as-threads helpers are in distributed_ranks.h.)
// Multi-rank checkpoints (ckpt/distributed.h) with ranks as threads of this
// process sharing an in-process store: every rank writes its part, the
// checkpoint commits once for all or not at all, each rank reads its part
// back bit-exact, replicated tensors are written once, and a failing,
// missing or disagreeing rank fails the save on every rank within the
// commit timeout (never a hang).
#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <set>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "ckpt/catalog.h"
#include "ckpt/distributed.h"
#include "ckpt/engine.h"
#include "ckpt/reader.h"
#include "gtest/gtest.h"
#include "distributed_ranks.h"
#include "test_util.h"
#include "testing/fault_injection_file_system.h"

namespace ckpt {
namespace {

using testing::ExpectRankPart;
using testing::OwnedTensor;
using testing::Placed;
using testing::RankState;
using testing::Ranks;
using testing::Step;
using testing::RandomTensor;
using testing::ScratchDir;

class DistributedEngineTest : public ::testing::TestWithParam<int> {};

TEST_P(DistributedEngineTest, FullAndDeltaSavesRestoreEveryRankBitExact) {
  const int world = GetParam();
  ScratchDir dir;
  const std::string root = dir.Join("root");
  EngineOptions options = testing::SmallChunks();
  options.delta.mode = DeltaOptions::Mode::kExact;
  options.delta.full_every = 3;
  Ranks ranks(root, world, options, absl::Seconds(20));
  std::vector<std::vector<OwnedTensor>> states;
  for (int r = 0; r < world; ++r) states.push_back(RankState(r, 7));
  std::map<int64_t, std::vector<std::vector<OwnedTensor>>> saved;
  for (int64_t step = 1; step <= 5; ++step) {
    for (int r = 0; r < world; ++r) Step(states[r], r, step);
    std::vector<absl::Status> outcome = ranks.Save(std::vector<int64_t>(world, step), states);
    for (int r = 0; r < world; ++r) ASSERT_TRUE(outcome[r].ok()) << "rank " << r << ": " << outcome[r];
    saved[step] = states;
  }
  for (int r = 0; r < world; ++r) {
    const SaveStats last = ranks.engine(r).stats().last;
    EXPECT_EQ(last.rank, r);
    EXPECT_EQ(last.world_size, world);
    EXPECT_GT(last.commit_latency_s, 0) << r;
    // The spans lie within the save (SaveAsync to commit) and in order:
    // rank 0 waits for the parts, then commits; the others wait for rank
    // 0's decision, then for its outcome (commit_latency_s counts both).
    EXPECT_LE(last.ranks_wait_s, last.seconds) << r;
    if (r == 0) {
      EXPECT_LE(last.ranks_wait_s + last.commit_latency_s, last.seconds + 1e-6);
    } else {
      EXPECT_GT(last.ranks_wait_s, 0) << r;
      EXPECT_LE(last.ranks_wait_s, last.commit_latency_s + 1e-6) << r;
    }
  }
  auto summaries = ListCheckpoints(root);
  ASSERT_TRUE(summaries.ok()) << summaries.status();
  ASSERT_EQ(summaries->size(), 5u);
  for (const CheckpointSummary& s : *summaries) {
    ASSERT_TRUE(s.manifest_status.ok()) << s.manifest_status;
    EXPECT_EQ(s.world_size, world);
    const bool full = s.step == 1 || s.step == 4;
    EXPECT_EQ(s.kind, full ? CheckpointKind::kFull : CheckpointKind::kDelta) << "step " << s.step;
    if (!full) EXPECT_EQ(s.base_step, s.step < 4 ? 1 : 4);  // differential: the last full save
  }
  for (const auto& [step, per_rank] : saved) {
    for (int r = 0; r < world; ++r) ExpectRankPart(root, step, r, world, per_rank[r]);
  }
  // The whole checkpoint: replicated tensors once, every rank's others
  // under "rank<r>/".
  ReaderOptions all;
  auto reader = Reader::Open(root, all);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->step(), 5);
  EXPECT_EQ((*reader)->rank(), -1);
  EXPECT_EQ((*reader)->tensors().size(), 4u + 2u * world);
  EXPECT_NE((*reader)->Find("model.embed.weight"), nullptr);
  for (int r = 0; r < world; ++r) {
    const TensorInfo* rng = (*reader)->Find(absl::StrCat("rank", r, "/rng.state"));
    ASSERT_NE(rng, nullptr) << r;
    EXPECT_EQ(rng->rank, r);
    EXPECT_EQ(rng->placement, TensorPlacement::kRankLocal);
  }
  EXPECT_TRUE((*reader)->Verify().ok());
  ranks.CloseAll();
}

INSTANTIATE_TEST_SUITE_P(Worlds, DistributedEngineTest, ::testing::Values(2, 4),
                         [](const auto& info) { return absl::StrCat(info.param, "Ranks"); });

TEST(DistributedEngine, ReplicatedTensorsAreWrittenOnceSpreadOverTheRanks) {
  const int world = 4;
  ScratchDir dir;
  const std::string root = dir.Join("root");
  Ranks ranks(root, world, testing::SmallChunks(), absl::Seconds(20));
  std::vector<std::vector<OwnedTensor>> states;
  for (int r = 0; r < world; ++r) states.push_back(RankState(r, 3));
  std::vector<absl::Status> outcome = ranks.Save(std::vector<int64_t>(world, 10), states);
  for (int r = 0; r < world; ++r) ASSERT_TRUE(outcome[r].ok()) << outcome[r];
  uint64_t replicated = 0, local = 0;
  for (const OwnedTensor& t : states[0]) {
    (absl::StartsWith(t.name, "model.") || absl::StartsWith(t.name, "optim.") ? replicated : local) +=
        t.bytes.size();
  }
  auto summary = SummarizeCheckpoint(root, 10);
  ASSERT_TRUE(summary.ok()) << summary.status();
  // Each replicated byte once, each rank's own bytes once per rank.
  EXPECT_EQ(summary->tensor_bytes, replicated + world * local);
  EXPECT_EQ(summary->tensor_count, 4u + 2u * world);
  uint64_t shard_bytes = 0;
  std::set<std::string> writers;
  for (const auto& e : std::filesystem::directory_iterator(root + "/" + StepDirName(10))) {
    const std::string name = e.path().filename().string();
    if (absl::EndsWith(name, ".shard")) {
      shard_bytes += e.file_size();
      writers.insert(name.substr(0, 10));  // "rank-0000r"
    }
  }
  EXPECT_LT(shard_bytes, replicated + world * local + 16 * 4096 * world);  // alignment padding only
  EXPECT_GE(writers.size(), 2u) << "replicated tensors should be spread over the ranks";
  ranks.CloseAll();
}

TEST(DistributedEngine, ADefaultTensorThatDiffersBetweenRanksFailsTheSaveOnEveryRank) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  Ranks ranks(root, 2, testing::SmallChunks(), absl::Seconds(20));
  std::vector<std::vector<OwnedTensor>> states = {RankState(0, 1), RankState(1, 1)};
  ASSERT_TRUE(ranks.Save({1, 1}, states)[0].ok());
  for (int r = 0; r < 2; ++r) {
    states[r].push_back(RandomTensor("head.bias", DType::kFloat32, {10}, 50 + r));
  }
  std::vector<absl::Status> outcome = ranks.Save({2, 2}, states);
  for (int r = 0; r < 2; ++r) {
    EXPECT_FALSE(outcome[r].ok()) << r;
    EXPECT_TRUE(absl::StrContains(outcome[r].message(), "\"head.bias\"")) << outcome[r];
    EXPECT_TRUE(absl::StrContains(outcome[r].message(), "differs between rank 0 and rank 1")) << outcome[r];
  }
  EXPECT_FALSE(std::filesystem::exists(root + "/" + StepDirName(2)));
  auto latest = ReadLatestHint(root);
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(latest->value_or(-1), 1);
  // Under another name, still of default placement, it is still refused.
  for (int r = 0; r < 2; ++r) states[r].back().name = "rng.state2";
  outcome = ranks.Save({3, 3}, states);
  EXPECT_FALSE(outcome[0].ok());
  // Without it, step 3 commits (a second attempt at the step).
  for (int r = 0; r < 2; ++r) states[r].pop_back();
  outcome = ranks.Save({3, 3}, states);
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(outcome[r].ok()) << outcome[r];
  ranks.CloseAll();
}

TEST(DistributedEngine, ARankWhoseWritesFailAbortsTheSaveOnEveryRankAndTheNextSaveCommits) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  auto faulty = std::make_shared<testing::FaultInjectionFileSystem>(PosixFileSystem());
  EngineOptions options = testing::SmallChunks();
  options.delta.mode = DeltaOptions::Mode::kExact;
  Ranks ranks(root, 3, options, absl::Seconds(20),
              [&](int r) -> std::shared_ptr<FileSystem> { return r == 1 ? faulty : nullptr; });
  std::vector<std::vector<OwnedTensor>> states = {RankState(0, 5), RankState(1, 5), RankState(2, 5)};
  std::vector<absl::Status> outcome = ranks.Save({1, 1, 1}, states);
  for (int r = 0; r < 3; ++r) ASSERT_TRUE(outcome[r].ok()) << outcome[r];
  for (int r = 0; r < 3; ++r) Step(states[r], r, 2);
  faulty->FailAt(faulty->call_count() + 6, testing::Fault::kEio);
  outcome = ranks.Save({2, 2, 2}, states);
  for (int r = 0; r < 3; ++r) {
    EXPECT_FALSE(outcome[r].ok()) << "rank " << r;
    EXPECT_TRUE(absl::StrContains(outcome[r].message(), "EIO") ||
                absl::StrContains(outcome[r].message(), "rank 1 failed"))
        << "rank " << r << ": " << outcome[r];
  }
  EXPECT_TRUE(absl::StrContains(outcome[0].message(), "rank 1 failed")) << outcome[0];
  EXPECT_TRUE(absl::StrContains(outcome[2].message(), "rank 1 failed")) << outcome[2];
  EXPECT_FALSE(std::filesystem::exists(root + "/" + StepDirName(2)));
  ExpectRankPart(root, 1, 2, 3, RankState(2, 5));
  // The engines go on: the next save (full, after the failure) commits.
  faulty->ClearFaults();
  for (int r = 0; r < 3; ++r) Step(states[r], r, 3);
  outcome = ranks.Save({3, 3, 3}, states);
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(outcome[r].ok()) << outcome[r];
  auto summary = SummarizeCheckpoint(root, 3);
  ASSERT_TRUE(summary.ok());
  EXPECT_EQ(summary->kind, CheckpointKind::kFull);
  for (int r = 0; r < 3; ++r) ExpectRankPart(root, 3, r, 3, states[r]);
  ranks.CloseAll();
}

TEST(DistributedEngine, ARankThatDoesNotSaveFailsTheSaveWithinTheTimeoutNamingIt) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  Ranks ranks(root, 2, testing::SmallChunks(), absl::Seconds(1));
  std::vector<std::vector<OwnedTensor>> states = {RankState(0, 9), RankState(1, 9)};
  const absl::Time start = absl::Now();
  std::vector<absl::Status> outcome = ranks.Save({5, 5}, states, /*ranks=*/{0});
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_TRUE(absl::IsDeadlineExceeded(outcome[0])) << outcome[0];
  EXPECT_TRUE(absl::StrContains(outcome[0].message(), "rank 1 did not report")) << outcome[0];
  EXPECT_FALSE(std::filesystem::exists(root + "/" + StepDirName(5)));
  // Both save the next step: it commits.
  outcome = ranks.Save({6, 6}, states);
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(outcome[r].ok()) << outcome[r];
  ranks.CloseAll();
}

TEST(DistributedEngine, RanksSavingDifferentStepsFailOnEveryRank) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  Ranks ranks(root, 2, testing::SmallChunks(), absl::Seconds(1));
  std::vector<std::vector<OwnedTensor>> states = {RankState(0, 2), RankState(1, 2)};
  std::vector<absl::Status> outcome = ranks.Save({7, 8}, states);
  EXPECT_FALSE(outcome[0].ok());
  EXPECT_FALSE(outcome[1].ok());
  EXPECT_TRUE(absl::StrContains(outcome[0].message(), "rank 1 (saving step 8) did not report")) << outcome[0];
  EXPECT_TRUE(absl::StrContains(outcome[1].message(), "no decision from rank 0")) << outcome[1];
  EXPECT_FALSE(std::filesystem::exists(root + "/" + StepDirName(7)));
  EXPECT_FALSE(std::filesystem::exists(root + "/" + StepDirName(8)));
  ranks.CloseAll();
}

TEST(DistributedEngine, OpenChecksTheOptionsAndWaitsForRankZeroWithADeadline) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  EngineOptions options;
  options.distributed.world_size = 2;
  options.distributed.rank = 2;
  options.distributed.store = NewInProcessStore();
  EXPECT_TRUE(absl::IsInvalidArgument(Engine::Open(root, options).status()));
  options.distributed.rank = 1;
  options.distributed.store = nullptr;
  EXPECT_TRUE(absl::IsInvalidArgument(Engine::Open(root, options).status()));
  options.distributed.store = NewInProcessStore();
  options.when_busy = EngineOptions::BusyPolicy::kSkip;
  EXPECT_TRUE(absl::IsInvalidArgument(Engine::Open(root, options).status()));
  options.when_busy = EngineOptions::BusyPolicy::kWait;
  options.distributed.commit_timeout = absl::Milliseconds(300);
  auto alone = Engine::Open(root, options);
  EXPECT_TRUE(absl::IsDeadlineExceeded(alone.status())) << alone.status();
  EXPECT_TRUE(absl::StrContains(alone.status().message(), "rank 0 did not open")) << alone.status();
  // A world size that differs from rank 0's.
  options.distributed.rank = 0;
  auto zero = Engine::Open(root, options);
  ASSERT_TRUE(zero.ok()) << zero.status();
  EngineOptions other = options;
  other.distributed.rank = 1;
  other.distributed.world_size = 3;
  EXPECT_TRUE(absl::IsInvalidArgument(Engine::Open(root, other).status()));
  // The same prefix again: refused, it would mix two engines' keys.
  (void)(*zero)->Close();
  zero->reset();
  auto again = Engine::Open(root, options);
  EXPECT_TRUE(absl::IsFailedPrecondition(again.status())) << again.status();
}

// Ranks whose ROOT is not one shared directory (node-local disks given the
// same path) used to open, train, and fail their first save when rank 0
// could not read their parts; now the rank that does not see rank 0's ROOT
// fails at open, saying why.
TEST(DistributedEngine, ARankThatDoesNotSeeRankZerosRootFailsAtOpen) {
  ScratchDir dir;
  EngineOptions options = testing::RankOptions(NewInProcessStore(), 2, 0);
  auto zero = Engine::Open(dir.Join("node-a"), options);
  ASSERT_TRUE(zero.ok()) << zero.status();
  options.distributed.rank = 1;
  for (const bool stale : {false, true}) {
    // Another machine's ROOT: empty, or with a lock file a job there left.
    const std::string other = dir.Join(stale ? "node-c" : "node-b");
    if (stale) {
      std::filesystem::create_directories(other);
      std::ofstream(other + "/.ckpt-writer.lock") << "ckpt engine, pid 1 on host c, since 2026-01-01T00:00:00Z\n";
    }
    const absl::Time start = absl::Now();
    auto one = Engine::Open(other, options);
    ASSERT_TRUE(absl::IsFailedPrecondition(one.status())) << one.status();
    EXPECT_LT(absl::Now() - start, absl::Seconds(10));
    const std::string message(one.status().message());
    EXPECT_TRUE(absl::StrContains(message, "rank 1 (host ")) << message;
    EXPECT_TRUE(absl::StrContains(message, "does not see rank 0's checkpoint root " + other)) << message;
    EXPECT_TRUE(absl::StrContains(message, "a file system every rank shares")) << message;
    EXPECT_TRUE(absl::StrContains(message, stale ? "holds \"ckpt engine, pid 1 on host c" : "cannot be read"))
        << message;
  }
  // The same ROOT: opens (and saves) as ever.
  auto same = Engine::Open(dir.Join("node-a"), options);
  ASSERT_TRUE(same.ok()) << same.status();
}

TEST(DistributedEngine, CancelWhileWaitingForAnotherRankReturnsPromptly) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  auto store = std::make_shared<testing::WaitSignallingStore>("/report/1");
  Ranks ranks(root, 2, testing::SmallChunks(), absl::Seconds(60), nullptr, store);
  std::vector<OwnedTensor> state = RankState(0, 4);
  std::vector<TensorView> views = Placed(state);
  auto handle = ranks.engine(0).SaveAsync(3, views);
  ASSERT_TRUE(handle.ok()) << handle.status();
  ASSERT_TRUE(store->AwaitWaiter(absl::Seconds(30))) << "rank 0 never waited for rank 1's report";
  const absl::Time start = absl::Now();
  testing::RunOrDie([&] { (void)ranks.engine(0).Close(Engine::CloseMode::kCancel); }, absl::Seconds(20),
                    "Close(kCancel) while rank 0 waits for rank 1");
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  absl::Status s = testing::WaitOrDie(**handle, testing::kRankDeadline, "cancelled save");
  EXPECT_FALSE(s.ok());
  EXPECT_FALSE(std::filesystem::exists(root + "/" + StepDirName(3)));
}

// A store hosted in rank 0's process (a TCPStore under init_method="tcp://"),
// which goes when that process exits (`Leave`): every call after it fails as
// a TCPStore client's does. Rank 1's read of the result is slow to come back
// (a loaded machine), and `drop_seen` loses rank 1's word that it read it (a
// rank that died right after).
class StoreHostedByRankZero final : public CoordinationStore {
 public:
  explicit StoreHostedByRankZero(bool drop_seen = false) : drop_seen_(drop_seen) {}
  void Leave() { gone_ = true; }
  absl::Status Set(const std::string& key, const std::string& value) override {
    if (gone_) return Gone(key);
    if (drop_seen_ && absl::StrContains(key, "/seen/")) return absl::OkStatus();
    return base_->Set(key, value);
  }
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    if (gone_) return Gone(key);
    absl::StatusOr<std::string> value = base_->Get(key, timeout);
    if (value.ok() && absl::EndsWith(key, "/result")) {
      absl::SleepFor(absl::Milliseconds(300));
      if (gone_) return Gone(key);
    }
    return value;
  }
  absl::StatusOr<std::string> SetIfAbsent(const std::string& key, const std::string& value) override {
    if (gone_) return Gone(key);
    return base_->SetIfAbsent(key, value);
  }

 private:
  static absl::Status Gone(const std::string& key) {
    return absl::UnavailableError(absl::StrCat("get key \"", key, "\": Connection reset by peer"));
  }
  const std::shared_ptr<CoordinationStore> base_ = NewInProcessStore();
  const bool drop_seen_;
  std::atomic<bool> gone_{false};
};

// Rank 0 saves its last checkpoint and exits, taking the store along, while
// rank 1 has yet to read the result: rank 0's save completes only once rank 1
// has it, so both saves succeed.
TEST(DistributedEngine, RankZeroLeavingRightAfterItsSaveDoesNotFailTheOthers) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  auto store = std::make_shared<StoreHostedByRankZero>();
  Ranks ranks(root, 2, testing::SmallChunks(), absl::Seconds(30), nullptr, store);
  std::vector<std::vector<OwnedTensor>> states = {RankState(0, 12), RankState(1, 12)};
  std::vector<absl::Status> outcome(2);
  Ranks::Parallel(2, [&](int r) {
    std::vector<TensorView> views = Placed(states[r]);
    auto handle = ranks.engine(r).SaveAsync(4, views);
    ASSERT_TRUE(handle.ok()) << handle.status();
    outcome[r] = testing::WaitOrDie(**handle, testing::kRankDeadline, absl::StrCat("rank ", r));
    if (r == 0) store->Leave();
  });
  EXPECT_TRUE(outcome[0].ok()) << outcome[0];
  EXPECT_TRUE(outcome[1].ok()) << outcome[1];
  for (int r = 0; r < 2; ++r) ExpectRankPart(root, 4, r, 2, states[r]);
}

// A rank that never says it read the result (it died) holds rank 0's save
// back at most commit_timeout, and the committed save stays a success.
TEST(DistributedEngine, ARankThatNeverConfirmsTheResultDelaysRankZeroBoundedly) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  auto store = std::make_shared<StoreHostedByRankZero>(/*drop_seen=*/true);
  Ranks ranks(root, 2, testing::SmallChunks(), absl::Seconds(1), nullptr, store);
  std::vector<std::vector<OwnedTensor>> states = {RankState(0, 13), RankState(1, 13)};
  const absl::Time start = absl::Now();
  std::vector<absl::Status> outcome = ranks.Save({2, 2}, states);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_TRUE(outcome[0].ok()) << outcome[0];
  EXPECT_TRUE(outcome[1].ok()) << outcome[1];
  EXPECT_TRUE(std::filesystem::exists(root + "/" + StepDirName(2)));
  ranks.CloseAll();
}

// Damage to any part of a multi-rank checkpoint is kDataLoss naming it, and
// a reader of the newest checkpoint falls back to the step before.
TEST(DistributedEngine, ADamagedPartIsDataLossAndTheNewestReaderFallsBack) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  std::vector<std::vector<OwnedTensor>> states = {RankState(0, 31), RankState(1, 31)};
  {
    Ranks ranks(root, 2, testing::SmallChunks(), absl::Seconds(20));
    for (int64_t step = 1; step <= 2; ++step) {
      std::vector<absl::Status> outcome = ranks.Save({step, step}, states);
      ASSERT_TRUE(outcome[0].ok() && outcome[1].ok()) << outcome[0] << " / " << outcome[1];
    }
    ranks.CloseAll();
  }
  const std::string step2 = root + "/" + StepDirName(2);
  auto open_step = [&](std::optional<int64_t> step, std::optional<int> rank) {
    ReaderOptions options;
    options.step = step;
    options.rank = rank;
    return Reader::Open(root, options);
  };
  auto read_file = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  auto write_file = [](const std::string& path, const std::string& contents) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << contents;
  };
  const std::string global = read_file(step2 + "/MANIFEST.json");
  const std::string part1 = read_file(step2 + "/rank-00001.MANIFEST.json");
  // An edited step manifest.
  std::string edited = global;
  edited[edited.find("\"world_size\": 2") + 14] = '3';
  write_file(step2 + "/MANIFEST.json", edited);
  auto r = open_step(2, std::nullopt);
  EXPECT_TRUE(absl::IsDataLoss(r.status())) << r.status();
  write_file(step2 + "/MANIFEST.json", global);
  // A rank's manifest missing: every view of the step is refused, naming it.
  std::filesystem::remove(step2 + "/rank-00001.MANIFEST.json");
  for (std::optional<int> rank : {std::optional<int>(), std::optional<int>(0), std::optional<int>(1)}) {
    r = open_step(2, rank);
    EXPECT_TRUE(absl::IsDataLoss(r.status())) << r.status();
    EXPECT_TRUE(absl::StrContains(r.status().message(), "rank-00001.MANIFEST.json")) << r.status();
  }
  // The newest reader skips step 2 and opens step 1.
  r = open_step(std::nullopt, 1);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->step(), 1);
  // Another valid manifest in its place: not the one the list names.
  write_file(step2 + "/rank-00001.MANIFEST.json", read_file(root + "/" + StepDirName(1) + "/rank-00001.MANIFEST.json"));
  r = open_step(2, 1);
  EXPECT_TRUE(absl::IsDataLoss(r.status())) << r.status();
  write_file(step2 + "/rank-00001.MANIFEST.json", part1);
  // A flipped byte in a rank's shard: verify names the shard.
  for (const auto& e : std::filesystem::directory_iterator(step2)) {
    const std::string name = e.path().filename().string();
    if (!absl::StartsWith(name, "rank-00001.") || !absl::EndsWith(name, ".shard")) continue;
    std::string bytes = read_file(e.path().string());
    bytes[0] ^= 1;
    write_file(e.path().string(), bytes);
    break;
  }
  r = open_step(2, std::nullopt);
  ASSERT_TRUE(r.ok()) << r.status();
  absl::Status verified = (*r)->Verify();
  EXPECT_TRUE(absl::IsDataLoss(verified)) << verified;
  EXPECT_TRUE(absl::StrContains(verified.message(), "rank-00001.")) << verified;
  // A rank that does not exist.
  r = open_step(2, 2);
  EXPECT_TRUE(absl::IsNotFound(r.status())) << r.status();
}

// A delta's base is the base step's part of the same rank, checked against
// that step's manifest: a damaged base step breaks the delta, as it does
// for one process.
TEST(DistributedEngine, ADeltaWhoseBaseStepManifestIsDamagedIsDataLoss) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  EngineOptions options = testing::SmallChunks();
  options.delta.mode = DeltaOptions::Mode::kExact;
  std::vector<std::vector<OwnedTensor>> states = {RankState(0, 41), RankState(1, 41)};
  {
    Ranks ranks(root, 2, options, absl::Seconds(20));
    for (int64_t step = 1; step <= 2; ++step) {
      for (int r = 0; r < 2; ++r) Step(states[r], r, step);
      std::vector<absl::Status> outcome = ranks.Save({step, step}, states);
      ASSERT_TRUE(outcome[0].ok() && outcome[1].ok()) << outcome[0] << " / " << outcome[1];
    }
    ranks.CloseAll();
  }
  auto summary = SummarizeCheckpoint(root, 2);
  ASSERT_TRUE(summary.ok());
  ASSERT_EQ(summary->kind, CheckpointKind::kDelta);
  std::filesystem::remove(root + "/" + StepDirName(1) + "/MANIFEST.json");
  for (int r = 0; r < 2; ++r) {
    ReaderOptions options2;
    options2.step = 2;
    options2.rank = r;
    auto reader = Reader::Open(root, options2);
    EXPECT_TRUE(absl::IsDataLoss(reader.status())) << reader.status();
    EXPECT_TRUE(absl::StrContains(reader.status().message(), "base checkpoint step 1")) << reader.status();
  }
}

// A crash (power loss) of rank 0's machine at any of its calls during a
// multi-rank save leaves that step either whole for every rank or absent,
// and the step before it whole; the other rank's save never hangs.
TEST(DistributedEngine, ACrashOfRankZeroAtEveryCallLeavesTheStepWholeOrAbsent) {
  ScratchDir dir;
  std::vector<std::vector<OwnedTensor>> first = {RankState(0, 21), RankState(1, 21)};
  std::vector<std::vector<OwnedTensor>> second = first;
  for (int r = 0; r < 2; ++r) Step(second[r], r, 2);
  EngineOptions options = testing::SmallChunks();
  options.delta.mode = DeltaOptions::Mode::kExact;
  uint64_t total = 0;
  int committed = 0, absent = 0;
  for (uint64_t n = 0; n == 0 || n <= total; ++n) {
    const std::string root = dir.Join(absl::StrCat("run", n));
    auto fs = std::make_shared<testing::FaultInjectionFileSystem>(PosixFileSystem());
    {
      Ranks ranks(root, 2, options, absl::Seconds(5),
                  [&](int r) -> std::shared_ptr<FileSystem> { return r == 0 ? fs : nullptr; });
      ASSERT_TRUE(ranks.Save({1, 1}, first)[0].ok());
      const uint64_t before = fs->call_count();
      if (n > 0) fs->FailAt(before + n, testing::Fault::kCrash);
      std::vector<absl::Status> outcome = ranks.Save({2, 2}, second);
      if (n == 0) {
        ASSERT_TRUE(outcome[0].ok() && outcome[1].ok()) << outcome[0] << " / " << outcome[1];
        total = fs->call_count() - before;
        ASSERT_GT(total, 20u);
      }
      ranks.CloseAll();
    }
    ASSERT_TRUE(fs->DropUnsyncedData().ok()) << "at call " << n;
    for (int r = 0; r < 2; ++r) ExpectRankPart(root, 1, r, 2, first[r]);
    if (std::filesystem::exists(root + "/" + StepDirName(2))) {
      ++committed;
      for (int r = 0; r < 2; ++r) ExpectRankPart(root, 2, r, 2, second[r]);
    } else {
      ++absent;
    }
    if (HasFailure()) {
      ADD_FAILURE() << "crash at call " << n << " of " << total << ": " << fs->first_injected_call();
      return;
    }
    testing::RemoveTree(root);
  }
  EXPECT_GT(committed, 0);
  EXPECT_GT(absent, 0);
}

}  // namespace
}  // namespace ckpt
