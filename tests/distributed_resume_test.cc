// Multi-rank engines reopened on a root with checkpoints (docs/deltas.md,
// "After a restart"; docs/distributed.md, "Deltas, retention and the cold
// tier"): each rank rebuilds its delta reference from its own part of the
// newest checkpoint, so the first save after the restart is a delta on
// every rank, restoring bit-exact; the ranks agree first, so when one
// rank cannot rebuild the first save is full on every rank, and commits.
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <ostream>
#include <random>
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

namespace ckpt {
namespace {

using testing::OwnedTensor;
using testing::Placed;
using testing::RandomTensor;
using testing::RankState;
using testing::Ranks;
using testing::ScratchDir;
using testing::Step;

using States = std::vector<std::vector<OwnedTensor>>;

constexpr char kSharded[] = "global.w";
constexpr int64_t kChunkRows = 32;

bool IsReplicated(const std::string& name) {
  return absl::StartsWith(name, "model.") || absl::StartsWith(name, "optim.");
}

// `RankState` plus this rank's rows of a sharded global tensor.
States InitialStates(int world, uint64_t seed) {
  States states;
  for (int r = 0; r < world; ++r) {
    states.push_back(RankState(r, seed));
    states[r].push_back(RandomTensor(kSharded, DType::kFloat32, {kChunkRows, 64}, seed + 300 + r));
  }
  return states;
}

std::vector<TensorView> Views(const std::vector<OwnedTensor>& state, int rank, int world) {
  std::vector<TensorView> views = Placed(state);
  for (TensorView& v : views) {
    if (v.name != kSharded) continue;
    v.placement = TensorPlacement::kSharded;
    v.global_shape = {kChunkRows * world, 64};
    v.global_offset = {kChunkRows * rank, 0};
  }
  return views;
}

// Every rank saves `step` of its state at once; returns each rank's stats
// (its own part's kind), after expecting every save to commit.
std::vector<SaveStats> SaveAll(Ranks& ranks, int64_t step, const States& states) {
  const int world = ranks.world();
  std::vector<absl::Status> outcome(world, absl::UnknownError("did not save"));
  std::vector<SaveStats> stats(world);
  Ranks::Parallel(world, [&](int r) {
    std::vector<TensorView> views = Views(states[r], r, world);
    auto handle = ranks.engine(r).SaveAsync(step, views);
    if (!handle.ok()) {
      outcome[r] = handle.status();
      return;
    }
    outcome[r] = testing::WaitOrDie(**handle, testing::kRankDeadline, absl::StrCat("rank ", r, " step ", step));
    stats[r] = (*handle)->stats();
  });
  for (int r = 0; r < world; ++r) EXPECT_TRUE(outcome[r].ok()) << "rank " << r << " step " << step << ": " << outcome[r];
  return stats;
}

// Steps `states` and saves steps `first` .. `first + count - 1`; returns
// each step's per-rank stats.
std::vector<std::vector<SaveStats>> SaveSteps(Ranks& ranks, int64_t first, int count, States& states,
                                              std::map<int64_t, States>* saved) {
  std::vector<std::vector<SaveStats>> out;
  for (int64_t step = first; step < first + count; ++step) {
    for (int r = 0; r < ranks.world(); ++r) Step(states[r], r, step);
    out.push_back(SaveAll(ranks, step, states));
    (*saved)[step] = states;
  }
  return out;
}

// Opens every rank's engine on `root` (after the first opening: a restart),
// saves steps `first` .. `first + count - 1` as SaveSteps does, and closes
// them.
std::vector<std::vector<SaveStats>> SaveStepsInOneOpening(const std::string& root, int world,
                                                          const EngineOptions& options, int64_t first,
                                                          int count, States& states,
                                                          std::map<int64_t, States>* saved) {
  Ranks ranks(root, world, options, absl::Seconds(20));
  std::vector<std::vector<SaveStats>> stats = SaveSteps(ranks, first, count, states, saved);
  ranks.CloseAll();
  return stats;
}

void ExpectKinds(const std::vector<SaveStats>& stats, CheckpointKind kind, const std::string& what) {
  for (size_t r = 0; r < stats.size(); ++r) {
    EXPECT_EQ(stats[r].kind, kind) << what << ": rank " << r << " saved " << testing::KindName(stats[r].kind);
  }
}

void ExpectBytes(const std::vector<uint8_t>& want, const Tensor& got, const std::string& what) {
  ASSERT_EQ(got.bytes.size(), want.size()) << what;
  EXPECT_TRUE(testing::SameBytes(want.data(), got.bytes.data(), want.size())) << what << " differs";
}

// Step `step` reads back bit-exact: each rank's part (its sharded chunk as
// a region), and the whole checkpoint (replicated tensors once, the others
// as "rank<r>/<name>", the sharded tensor whole).
void ExpectRestores(const std::string& root, int64_t step, const States& want) {
  const int world = static_cast<int>(want.size());
  for (int r = 0; r < world; ++r) {
    ReaderOptions options;
    options.step = step;
    options.rank = r;
    auto reader = Reader::Open(root, options);
    ASSERT_TRUE(reader.ok()) << "rank " << r << " step " << step << ": " << reader.status();
    for (const OwnedTensor& t : want[r]) {
      const std::string what = absl::StrCat("rank ", r, " step ", step, " ", t.name);
      if (t.name == kSharded) {
        std::vector<uint8_t> got(t.bytes.size());
        RegionTarget region{t.name, {kChunkRows * r, 0}, t.shape, got.data(), got.size()};
        ASSERT_TRUE((*reader)->ReadRegions({&region, 1}).ok()) << what;
        EXPECT_EQ(got, t.bytes) << what << " differs";
        continue;
      }
      auto got = (*reader)->Read(t.name);
      ASSERT_TRUE(got.ok()) << what << ": " << got.status();
      ExpectBytes(t.bytes, *got, what);
    }
    EXPECT_TRUE((*reader)->Verify().ok()) << "rank " << r << " step " << step;
  }
  ReaderOptions options;
  options.step = step;
  auto merged = Reader::Open(root, options);
  ASSERT_TRUE(merged.ok()) << "step " << step << ": " << merged.status();
  std::vector<uint8_t> global;
  for (int r = 0; r < world; ++r) {
    for (const OwnedTensor& t : want[r]) {
      if (t.name == kSharded) {
        global.insert(global.end(), t.bytes.begin(), t.bytes.end());
        continue;
      }
      if (IsReplicated(t.name) && r > 0) continue;
      const std::string name = IsReplicated(t.name) ? t.name : absl::StrCat("rank", r, "/", t.name);
      auto got = (*merged)->Read(name);
      ASSERT_TRUE(got.ok()) << "step " << step << " " << name << ": " << got.status();
      ExpectBytes(t.bytes, *got, absl::StrCat("step ", step, " ", name));
    }
  }
  auto got = (*merged)->Read(kSharded);
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectBytes(global, *got, absl::StrCat("step ", step, " ", kSharded, " (whole)"));
  EXPECT_TRUE((*merged)->Verify().ok()) << "step " << step;
}

void FlipByte(const std::string& path, long offset) {
  FILE* f = std::fopen(path.c_str(), "r+b");
  ASSERT_NE(f, nullptr) << path;
  ASSERT_EQ(std::fseek(f, offset, SEEK_SET), 0) << path;
  const int c = std::fgetc(f);
  ASSERT_EQ(std::fseek(f, offset, SEEK_SET), 0) << path;
  std::fputc(c ^ 0x5A, f);
  std::fclose(f);
}

// Flips a byte of rank `rank`'s first shard file of step `step`.
void DamageShardOfRank(const std::string& root, int64_t step, int rank) {
  const std::string dir = root + "/" + StepDirName(step);
  const std::string prefix = absl::StrCat("rank-", std::string(5 - std::to_string(rank).size(), '0'), rank, ".");
  std::string shard;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (absl::StartsWith(name, prefix) && absl::EndsWith(name, ".shard") && (shard.empty() || name < shard)) {
      shard = name;
    }
  }
  ASSERT_FALSE(shard.empty()) << "no shard of rank " << rank << " in " << dir;
  FlipByte(dir + "/" + shard, 0);
}

EngineOptions DeltaOptionsFor(DeltaOptions::Base base, int full_every) {
  EngineOptions options = testing::SmallChunks();
  options.delta.mode = DeltaOptions::Mode::kExact;
  options.delta.base = base;
  options.delta.full_every = full_every;
  return options;
}

struct Case {
  DeltaOptions::Base base;
  int world;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << (c.base == DeltaOptions::Base::kDifferential ? "differential, " : "chained, ") << c.world << " ranks";
}

class DistributedResumeTest : public ::testing::TestWithParam<Case> {
 protected:
  bool differential() const { return GetParam().base == DeltaOptions::Base::kDifferential; }
  int world() const { return GetParam().world; }

  // Steps 1..3 of a state from `seed` saved in a first opening of root_ (a
  // full save, then deltas; full_every 10).
  std::vector<std::vector<SaveStats>> SaveBeforeTheRestart(uint64_t seed) {
    states_ = InitialStates(world(), seed);
    return SaveStepsInOneOpening(root_, world(), options_, 1, 3, states_, &saved_);
  }
  // Steps 4 and 5, in a second opening.
  std::vector<std::vector<SaveStats>> SaveAfterTheRestart() {
    return SaveStepsInOneOpening(root_, world(), options_, 4, 2, states_, &saved_);
  }

  ScratchDir dir_;
  const std::string root_ = dir_.Join("root");
  const EngineOptions options_ = DeltaOptionsFor(GetParam().base, 10);
  States states_;
  std::map<int64_t, States> saved_;
};

TEST_P(DistributedResumeTest, TheFirstSaveAfterARestartIsADeltaOnEveryRank) {
  std::vector<std::vector<SaveStats>> before = SaveBeforeTheRestart(11);
  ASSERT_FALSE(HasFailure());
  ExpectKinds(before[0], CheckpointKind::kFull, "step 1");
  ExpectKinds(before[2], CheckpointKind::kDelta, "step 3");
  std::vector<std::vector<SaveStats>> after = SaveAfterTheRestart();
  ASSERT_FALSE(HasFailure());
  ExpectKinds(after[0], CheckpointKind::kDelta, "step 4, the first after the restart");
  ExpectKinds(after[1], CheckpointKind::kDelta, "step 5");
  for (int r = 0; r < world(); ++r) EXPECT_LT(after[0][r].file_bytes, before[0][r].file_bytes) << r;
  auto summary = SummarizeCheckpoint(root_, 4);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->kind, CheckpointKind::kDelta);
  EXPECT_EQ(summary->base_step, differential() ? 1 : 3);
  for (const auto& [step, want] : saved_) ExpectRestores(root_, step, want);
}

TEST_P(DistributedResumeTest, ADamagedPartOfOneRankMakesTheFirstSaveFullOnEveryRank) {
  SaveBeforeTheRestart(12);
  ASSERT_FALSE(HasFailure());
  // Rank 1's part of the full step, which either mode's rebuild reads.
  DamageShardOfRank(root_, 1, 1);
  {
    ReaderOptions check;
    check.step = 1;
    check.rank = 1;
    auto reader = Reader::Open(root_, check);
    ASSERT_TRUE(reader.ok()) << reader.status();
    ASSERT_TRUE(absl::IsDataLoss((*reader)->Verify())) << "the damage went unnoticed";
  }
  std::vector<std::vector<SaveStats>> after = SaveAfterTheRestart();
  ASSERT_FALSE(HasFailure());
  ExpectKinds(after[0], CheckpointKind::kFull, "step 4, the first after the restart");
  ExpectKinds(after[1], CheckpointKind::kDelta, "step 5");
  ExpectRestores(root_, 4, saved_[4]);
  ExpectRestores(root_, 5, saved_[5]);
}

// Rank 1's manifest of the newest step damaged (its checksum in the
// checkpoint's MANIFEST.json no longer matches): that step is not a
// checkpoint any more, for every rank alike, so every rank rebuilds from the
// step before it and the first save is a delta against that on every rank.
TEST_P(DistributedResumeTest, ADamagedManifestOfOneRankMakesEveryRankRebuildFromTheStepBefore) {
  SaveBeforeTheRestart(16);
  ASSERT_FALSE(HasFailure());
  FlipByte(root_ + "/" + StepDirName(3) + "/rank-00001.MANIFEST.json", 10);
  std::vector<std::vector<SaveStats>> after = SaveAfterTheRestart();
  ASSERT_FALSE(HasFailure());
  ExpectKinds(after[0], CheckpointKind::kDelta, "step 4, the first after the restart");
  ExpectKinds(after[1], CheckpointKind::kDelta, "step 5");
  auto summary = SummarizeCheckpoint(root_, 4);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->base_step, differential() ? 1 : 2) << "step 4 is not against the intact step";
  for (int64_t step : {1, 2, 4, 5}) ExpectRestores(root_, step, saved_[step]);
  // The damaged step is refused, not misread.
  ReaderOptions damaged;
  damaged.step = 3;
  EXPECT_FALSE(Reader::Open(root_, damaged).ok());
}

TEST_P(DistributedResumeTest, TurnedOffTheFirstSaveIsFullOnEveryRank) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  EngineOptions options = DeltaOptionsFor(GetParam().base, 10);
  States states = InitialStates(world(), 13);
  std::map<int64_t, States> saved;
  {
    SaveStepsInOneOpening(root, world(), options, 1, 2, states, &saved);
  }
  options.delta.resume_from_newest = false;
  {
    ExpectKinds(SaveStepsInOneOpening(root, world(), options, 3, 1, states, &saved)[0], CheckpointKind::kFull,
                "step 3");
  }
  ExpectRestores(root, 3, saved[3]);
}

// full_every = 3 counts the deltas each rank took before the restart: two
// deltas after a full save, so the first save after the restart is full.
TEST_P(DistributedResumeTest, FullEveryCountsTheDeltasBeforeTheRestart) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  const EngineOptions options = DeltaOptionsFor(GetParam().base, 3);
  States states = InitialStates(world(), 14);
  std::map<int64_t, States> saved;
  {
    std::vector<std::vector<SaveStats>> before = SaveStepsInOneOpening(root, world(), options, 1, 3, states, &saved);
    ASSERT_FALSE(HasFailure());
    ExpectKinds(before[2], CheckpointKind::kDelta, "step 3");
  }
  {
    std::vector<std::vector<SaveStats>> after = SaveStepsInOneOpening(root, world(), options, 4, 2, states, &saved);
    ASSERT_FALSE(HasFailure());
    ExpectKinds(after[0], CheckpointKind::kFull, "step 4");
    ExpectKinds(after[1], CheckpointKind::kDelta, "step 5");
  }
  // One delta (step 5) before this restart: one more after it, then full.
  {
    std::vector<std::vector<SaveStats>> more = SaveStepsInOneOpening(root, world(), options, 6, 2, states, &saved);
    ASSERT_FALSE(HasFailure());
    ExpectKinds(more[0], CheckpointKind::kDelta, "step 6");
    ExpectKinds(more[1], CheckpointKind::kFull, "step 7");
  }
  for (const auto& [step, want] : saved) ExpectRestores(root, step, want);
}

// Without a restart, ranks may also save different kinds: here rank 1's
// every tensor changes entirely at step 3 (all stored whole: its part is
// full) while rank 0's part is a delta. The save commits; with differential
// deltas the next save is then full on every rank (rank 0's decision says
// the kinds were mixed), so no later delta has parts of different bases.
TEST_P(DistributedResumeTest, MixedKindsInOneSaveKeepEveryLaterSaveCommitting) {
  States& states = states_;
  states = InitialStates(world(), 17);
  Ranks ranks(root_, world(), options_, absl::Seconds(20));
  std::vector<std::vector<SaveStats>> stats = SaveSteps(ranks, 1, 2, states, &saved_);
  // Rank 0's own tensors change as usual; every other tensor (the
  // replicated ones alike on every rank) to random bytes.
  Step(states[0], 0, 3);
  for (int r = 0; r < world(); ++r) {
    for (OwnedTensor& t : states[r]) {
      if (r == 0 && !IsReplicated(t.name)) continue;
      std::mt19937_64 rng(IsReplicated(t.name) ? 99 : 1000 + r);
      for (uint8_t& b : t.bytes) b = static_cast<uint8_t>(rng());
    }
  }
  stats.push_back(SaveAll(ranks, 3, states));
  saved_[3] = states;
  ASSERT_FALSE(HasFailure());
  EXPECT_EQ(stats[2][0].kind, CheckpointKind::kDelta) << "rank 0's part of step 3";
  for (int r = 1; r < world(); ++r) EXPECT_EQ(stats[2][r].kind, CheckpointKind::kFull) << "rank " << r << " step 3";
  std::vector<std::vector<SaveStats>> after = SaveSteps(ranks, 4, 3, states, &saved_);
  ranks.CloseAll();
  ASSERT_FALSE(HasFailure());
  // (Chained, the kinds may differ again at step 4 — rank 0's restore-read
  // bound counts step 3's whole records — which chained deltas allow.)
  if (differential()) ExpectKinds(after[0], CheckpointKind::kFull, "step 4");
  ExpectKinds(after[1], CheckpointKind::kDelta, "step 5");
  ExpectKinds(after[2], CheckpointKind::kDelta, "step 6");
  for (const auto& [step, want] : saved_) ExpectRestores(root_, step, want);
}

INSTANTIATE_TEST_SUITE_P(
    Modes, DistributedResumeTest,
    ::testing::Values(Case{DeltaOptions::Base::kDifferential, 2}, Case{DeltaOptions::Base::kChained, 2},
                      Case{DeltaOptions::Base::kDifferential, 3}, Case{DeltaOptions::Base::kChained, 3}),
    [](const auto& info) {
      return absl::StrCat(info.param.base == DeltaOptions::Base::kDifferential ? "Differential" : "Chained",
                          info.param.world, "Ranks");
    });

// One rank opened without `resume_from_newest`: it has no reference, so no
// rank takes the first save as a delta (each would be against another base).
TEST(DistributedResume, OneRankTurnedOffMakesTheFirstSaveFullOnEveryRank) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  const EngineOptions options = DeltaOptionsFor(DeltaOptions::Base::kDifferential, 10);
  States states = InitialStates(2, 15);
  std::map<int64_t, States> saved;
  {
    SaveStepsInOneOpening(root, 2, options, 1, 2, states, &saved);
  }
  std::shared_ptr<CoordinationStore> store = NewInProcessStore();
  std::vector<std::unique_ptr<Engine>> engines(2);
  Ranks::Parallel(2, [&](int r) {
    EngineOptions o = options;
    o.delta.resume_from_newest = r == 0;
    o.distributed.rank = r;
    o.distributed.world_size = 2;
    o.distributed.store = store;
    o.distributed.key_prefix = "ckpt/one-off";
    o.distributed.commit_timeout = absl::Seconds(20);
    auto engine = Engine::Open(root, o);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engines[r] = std::move(*engine);
  });
  ASSERT_TRUE(engines[0] != nullptr && engines[1] != nullptr);
  for (int r = 0; r < 2; ++r) Step(states[r], r, 3);
  std::vector<SaveStats> stats(2);
  Ranks::Parallel(2, [&](int r) {
    std::vector<TensorView> views = Views(states[r], r, 2);
    auto handle = engines[r]->SaveAsync(3, views);
    ASSERT_TRUE(handle.ok()) << handle.status();
    absl::Status s = testing::WaitOrDie(**handle, testing::kRankDeadline, absl::StrCat("rank ", r));
    EXPECT_TRUE(s.ok()) << "rank " << r << ": " << s;
    stats[r] = (*handle)->stats();
  });
  Ranks::Parallel(2, [&](int r) { (void)engines[r]->Close(); });
  ExpectKinds(stats, CheckpointKind::kFull, "step 3");
  saved[3] = states;
  ExpectRestores(root, 3, saved[3]);
}

// Ranks that share no ROOT (shared_root = false) rebuild their delta
// reference from their own copies alone, sharded chunks included (read as
// the records they are, not as regions of a global tensor the copy does not
// hold whole): the first save after a restart is a delta on every rank, and
// the union of the copies restores every step bit-exact.
TEST(DistributedResume, RanksThatShareNoRootTakeDeltasAfterARestartFromTheirOwnCopies) {
  for (const DeltaOptions::Base base : {DeltaOptions::Base::kDifferential, DeltaOptions::Base::kChained}) {
    constexpr int kWorld = 2;
    ScratchDir dir;
    const std::string root = dir.Join("root");
    std::filesystem::create_directories(root);
    EngineOptions options = DeltaOptionsFor(base, 10);
    options.distributed.shared_root = false;
    States states = InitialStates(kWorld, 21);
    std::map<int64_t, States> saved;
    std::vector<std::vector<SaveStats>> before =
        SaveStepsInOneOpening(root, kWorld, options, 1, 3, states, &saved);
    ASSERT_FALSE(HasFailure());
    ExpectKinds(before[2], CheckpointKind::kDelta, "step 3");
    std::vector<std::vector<SaveStats>> after = SaveStepsInOneOpening(root, kWorld, options, 4, 2, states, &saved);
    ASSERT_FALSE(HasFailure());
    ExpectKinds(after[0], CheckpointKind::kDelta, "step 4, the first after the restart");
    const std::string merged = dir.Join("merged");
    testing::MergeRankCopies(root, kWorld, merged);
    auto summary = SummarizeCheckpoint(merged, 4);
    ASSERT_TRUE(summary.ok()) << summary.status();
    EXPECT_EQ(summary->base_step, base == DeltaOptions::Base::kDifferential ? 1 : 3);
    for (const auto& [step, want] : saved) ExpectRestores(merged, step, want);
  }
}

}  // namespace
}  // namespace ckpt
