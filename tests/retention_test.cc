// The retention/tiering job: keeps what its rules say plus every base a kept
// delta needs, removes or moves the rest, and is safe beside a writer.
// (About 780 lines, over the house ~400: every rule and the cold tier share
// the root-building fixture; the crash sweeps are in
// maintenance_fault_sweep_test.cc.)
#include "retain/retention.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "ckpt/catalog.h"
#include "ckpt/engine.h"
#include "ckpt/reader.h"
#include "ckpt/root_lock.h"
#include "common/cli_flags.h"
#include "gtest/gtest.h"
#include "retain/cli.h"
#include "test_util.h"

namespace ckpt {
namespace {

using testing::Leftovers;
using testing::OwnedTensor;
using testing::RandomTensor;
using testing::ScratchDir;
using testing::Views;
using testing::RestoredStep;
using tools::RetentionAction;
using tools::RetentionPolicy;
using tools::RunRetention;
using Kind = RetentionAction::Kind;

EngineOptions DeltaEvery(int full_every) {
  EngineOptions options = testing::SmallChunks();
  options.delta.mode = DeltaOptions::Mode::kExact;
  // These tests are about chains of deltas: each against the one before.
  options.delta.base = DeltaOptions::Base::kChained;
  options.delta.max_restore_read_factor = 0;
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

// Saves steps 1..`last` into `root`, a full save every `full_every` saves,
// the rest deltas (`mode`); returns what each step restores to, once it is
// shown to be what was saved (bit for bit; top-k deltas from the values,
// testing::DiffFromSaved) -- so that the tests' comparisons with it after
// retention compare with the saved values, not with another read.
std::map<int64_t, RestoredStep> WriteSteps(const std::string& root, int full_every, int last,
                                           DeltaOptions::Mode mode = DeltaOptions::Mode::kExact) {
  EngineOptions options = DeltaEvery(full_every);
  options.delta.mode = mode;
  // These tests are about chains of deltas: each against the one before.
  options.delta.base = DeltaOptions::Base::kChained;
  options.delta.max_restore_read_factor = 0;
  auto engine = Engine::Open(root, options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  // Deltas much smaller than the state: compacting one pays only when it
  // frees a full checkpoint.
  std::vector<OwnedTensor> state = {RandomTensor("m.w", DType::kFloat32, {65536}, 1),
                                    RandomTensor("n.b", DType::kFloat32, {1000}, 2)};
  std::mt19937_64 rng(1);
  std::map<int64_t, std::vector<OwnedTensor>> saved;
  for (int step = 1; step <= last; ++step) {
    for (auto& t : state) Mutate(t, rng);
    saved[step] = state;
    auto stats = (*engine)->Save(step, Views(state), absl::StrCat(R"({"step": )", step, "}"));
    EXPECT_TRUE(stats.ok()) << stats.status();
    EXPECT_EQ(stats->kind, (step - 1) % full_every == 0 ? CheckpointKind::kFull : CheckpointKind::kDelta) << "step " << step;
  }
  std::map<int64_t, RestoredStep> restored;
  EXPECT_EQ(testing::ReadAllSteps(root, &restored), "");
  EXPECT_EQ(testing::DiffFromSaved(restored, saved, options.delta.topk_ratio), "");
  return restored;
}

std::map<int64_t, RestoredStep> Only(const std::map<int64_t, RestoredStep>& all,
                                     const std::vector<int64_t>& steps) {
  std::map<int64_t, RestoredStep> out;
  for (int64_t step : steps) out[step] = all.at(step);
  return out;
}

// Step -> action kind, and every action's error.
std::map<int64_t, Kind> Kinds(const std::vector<RetentionAction>& actions, std::string* errors) {
  std::map<int64_t, Kind> kinds;
  for (const RetentionAction& a : actions) {
    if (a.step >= 0) kinds[a.step] = a.kind;
    if (!a.error.empty()) absl::StrAppend(errors, a.name, ": ", a.error, "\n");
  }
  return kinds;
}

// Every entry of `dir` and its bytes (a dry run must change none).
std::map<std::string, std::string> Snapshot(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (testing::IsRootLockFile(e.path().filename())) continue;  // created by any run
    std::string bytes;
    if (e.is_regular_file()) {
      std::ifstream in(e.path(), std::ios::binary);
      bytes.assign(std::istreambuf_iterator<char>(in), {});
    }
    files[e.path().string()] = bytes;
  }
  return files;
}

class CompactionTest : public ::testing::TestWithParam<DeltaOptions::Mode> {};

// Fulls at 1 and 11. Kept: 4, 8, 12 (every 4th) and 13 (newest, with its
// chain 12, 11). 4 is compacted so that 1..3 can go; 8 keeps 5..7 (cheaper
// than writing a full checkpoint), chaining onto the compacted 4.
TEST_P(CompactionTest, CompactsTheOldestKeptDeltaOfAChainAndLetsItsBasesGo) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  const auto before = WriteSteps(root, 10, 13, GetParam());
  RetentionPolicy policy;
  policy.keep_every = 4;
  policy.dry_run = true;
  const auto snapshot = Snapshot(root);
  auto plan = RunRetention(root, policy);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(Snapshot(root) == snapshot);  // a dry run changes nothing
  std::string errors;
  const std::map<int64_t, Kind> want = {
      {1, Kind::kDelete}, {2, Kind::kDelete}, {3, Kind::kDelete}, {4, Kind::kCompact},
      {5, Kind::kKeep},   {6, Kind::kKeep},   {7, Kind::kKeep},   {8, Kind::kKeep},
      {9, Kind::kDelete}, {10, Kind::kDelete}, {11, Kind::kKeep}, {12, Kind::kKeep},
      {13, Kind::kKeep}};
  EXPECT_EQ(Kinds(*plan, &errors), want);
  for (const RetentionAction& a : *plan) {
    if (a.kind == Kind::kCompact) EXPECT_FALSE(a.done);
  }

  policy.dry_run = false;
  auto actions = RunRetention(root, policy);
  ASSERT_TRUE(actions.ok()) << actions.status();
  EXPECT_EQ(Kinds(*actions, &errors), want);
  EXPECT_EQ(errors, "");
  auto four = SummarizeCheckpoint(root, 4);
  ASSERT_TRUE(four.ok());
  EXPECT_EQ(four->kind, CheckpointKind::kFull);
  EXPECT_TRUE(four->compacted);
  EXPECT_EQ(testing::DiffSteps(root, Only(before, {4, 5, 6, 7, 8, 11, 12, 13})), "");
  auto latest = Reader::Open(root, ReaderOptions{});
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ((*latest)->step(), 13);

  // Nothing more to do on a second run.
  actions = RunRetention(root, policy);
  ASSERT_TRUE(actions.ok());
  for (const RetentionAction& a : *actions) EXPECT_EQ(a.kind, Kind::kKeep) << a.name;
}

INSTANTIATE_TEST_SUITE_P(ExactAndTopK, CompactionTest,
                         ::testing::Values(DeltaOptions::Mode::kExact, DeltaOptions::Mode::kTopK),
                         [](const auto& info) {
                           return info.param == DeltaOptions::Mode::kExact ? "Exact" : "TopK";
                         });

TEST(RetentionTest, WithoutCompactionKeptDeltasKeepTheirBases) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  const auto before = WriteSteps(root, 10, 13);
  RetentionPolicy policy;
  policy.keep_every = 4;
  policy.compact = false;
  auto actions = RunRetention(root, policy);
  ASSERT_TRUE(actions.ok()) << actions.status();
  for (const RetentionAction& a : *actions) EXPECT_NE(a.kind, Kind::kCompact) << a.name;
  EXPECT_EQ(testing::DiffSteps(root, Only(before, {1, 2, 3, 4, 5, 6, 7, 8, 11, 12, 13})), "");
}

// LATEST names an older step (say, a writer died before updating it): that
// step keeps its whole chain, uncompacted, like the newest.
TEST(RetentionTest, TheStepLatestNamesKeepsItsWholeChain) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  const auto before = WriteSteps(root, 10, 13);
  {
    std::ofstream latest(root + "/LATEST", std::ios::trunc);
    latest << StepDirName(8) << "\n";
  }
  RetentionPolicy policy;
  policy.keep_last = 1;
  auto actions = RunRetention(root, policy);
  ASSERT_TRUE(actions.ok()) << actions.status();
  for (const RetentionAction& a : *actions) EXPECT_NE(a.kind, Kind::kCompact) << a.name;
  EXPECT_EQ(testing::DiffSteps(root, Only(before, {1, 2, 3, 4, 5, 6, 7, 8, 11, 12, 13})), "");
  EXPECT_EQ(SummarizeCheckpoint(root, 8)->kind, CheckpointKind::kDelta);
}

// A kept delta whose chain is damaged is not compacted (the reader refuses
// it) and keeps every base: the failure is reported, nothing is lost.
TEST(RetentionTest, AFailedCompactionKeepsTheBasesItWouldHaveFreed) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  const auto before = WriteSteps(root, 10, 13);
  // A flipped byte in a record of step 1, which only reading the data finds.
  std::string shard;
  for (const auto& e : std::filesystem::directory_iterator(root + "/" + StepDirName(1))) {
    if (e.path().extension() == ".shard") shard = e.path().string();
  }
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    char c;
    f.seekg(10);
    f.get(c);
    f.seekp(10);
    f.put(static_cast<char>(c ^ 0x40));
  }
  RetentionPolicy policy;
  policy.keep_every = 4;
  auto actions = RunRetention(root, policy);
  ASSERT_TRUE(actions.ok()) << actions.status();
  std::string errors;
  auto kinds = Kinds(*actions, &errors);
  EXPECT_EQ(kinds[4], Kind::kCompact);
  EXPECT_TRUE(absl::StrContains(errors, StepDirName(4))) << errors;
  for (int64_t step : {1, 2, 3}) EXPECT_EQ(kinds[step], Kind::kKeep) << step;
  EXPECT_EQ(*ListSteps(root), (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 11, 12, 13}));
  EXPECT_EQ(SummarizeCheckpoint(root, 4)->kind, CheckpointKind::kDelta);
  EXPECT_TRUE(Leftovers(root).empty());
  // What does not depend on the damaged step still restores as before.
  for (int64_t step : {11, 12, 13}) {
    std::map<int64_t, RestoredStep> got;
    const std::string copy = dir.Join(absl::StrCat("only", step));
    std::filesystem::create_directory(copy);
    for (int64_t s : {11, 12, 13}) {
      if (s > step) continue;
      std::filesystem::copy(root + "/" + StepDirName(s), copy + "/" + StepDirName(s),
                            std::filesystem::copy_options::recursive);
    }
    EXPECT_EQ(testing::DiffSteps(copy, Only(before, step == 11   ? std::vector<int64_t>{11}
                                                    : step == 12 ? std::vector<int64_t>{11, 12}
                                                                 : std::vector<int64_t>{11, 12, 13})),
              "");
  }
}

// Fulls at 1, 5, 9, 13; kept: every 3rd step and 14 (newest, chain 13).
// Hot: 3 and 6 compacted (so 1, 2 and 5 can go), 12 keeps 10 and 11.
// Cold: 1, 2, 5, 8 as they are; 4 and 7, whose bases stay hot, as full
// checkpoints. Every step restores as before, in whichever tier it is.
TEST(RetentionTest, ColdTierNeverGetsADeltaWithoutItsBase) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  const std::string cold = dir.Join("cold");
  std::filesystem::create_directory(cold);
  const auto before = WriteSteps(root, 4, 14);
  const std::string backup = dir.Join("backup");
  std::filesystem::copy(root, backup, std::filesystem::copy_options::recursive);
  RetentionPolicy policy;
  policy.keep_every = 3;
  policy.cold_dir = cold;
  auto actions = RunRetention(root, policy);
  ASSERT_TRUE(actions.ok()) << actions.status();
  std::string errors;
  const std::map<int64_t, Kind> want = {
      {1, Kind::kMove},  {2, Kind::kMove},  {3, Kind::kCompact}, {4, Kind::kCompactMove},
      {5, Kind::kMove},  {6, Kind::kCompact}, {7, Kind::kCompactMove}, {8, Kind::kMove},
      {9, Kind::kKeep},  {10, Kind::kKeep}, {11, Kind::kKeep}, {12, Kind::kKeep},
      {13, Kind::kKeep}, {14, Kind::kKeep}};
  EXPECT_EQ(Kinds(*actions, &errors), want);
  EXPECT_EQ(errors, "");
  EXPECT_EQ(testing::DiffSteps(root, Only(before, {3, 6, 9, 10, 11, 12, 13, 14})), "");
  EXPECT_EQ(testing::DiffSteps(cold, Only(before, {1, 2, 4, 5, 7, 8})), "");
  EXPECT_TRUE(SummarizeCheckpoint(cold, 4)->compacted);
  EXPECT_FALSE(std::filesystem::exists(cold + "/LATEST"));

  // A run interrupted after its cold copies were complete but before the hot
  // ones were removed: the next run recognises the copies and finishes.
  for (int64_t step : {2, 4}) {
    std::filesystem::copy(backup + "/" + StepDirName(step), root + "/" + StepDirName(step),
                          std::filesystem::copy_options::recursive);
  }
  actions = RunRetention(root, policy);
  ASSERT_TRUE(actions.ok()) << actions.status();
  errors.clear();
  auto kinds = Kinds(*actions, &errors);
  EXPECT_EQ(errors, "");
  EXPECT_EQ(kinds[2], Kind::kMove);
  EXPECT_EQ(kinds[4], Kind::kCompactMove);
  EXPECT_EQ(testing::DiffSteps(root, Only(before, {3, 6, 9, 10, 11, 12, 13, 14})), "");
  EXPECT_EQ(testing::DiffSteps(cold, Only(before, {1, 2, 4, 5, 7, 8})), "");
}

TEST(RetentionTest, ColdTierWithoutCompactionKeepsDeltasWhoseBaseStaysHot) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  const std::string cold = dir.Join("cold");
  std::filesystem::create_directory(cold);
  const auto before = WriteSteps(root, 4, 14);
  RetentionPolicy policy;
  policy.keep_every = 3;
  policy.cold_dir = cold;
  policy.compact = false;
  auto actions = RunRetention(root, policy);
  ASSERT_TRUE(actions.ok()) << actions.status();
  for (const RetentionAction& a : *actions) {
    EXPECT_NE(a.kind, Kind::kCompact) << a.name;
    EXPECT_NE(a.kind, Kind::kCompactMove) << a.name;
  }
  // 4 and 7 would need their (hot) bases; 8 needs 7. Nothing can move.
  EXPECT_EQ(testing::DiffSteps(root, before), "");
  EXPECT_TRUE(ListSteps(cold)->empty());
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
            absl::StatusCode::kInvalidArgument);
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
  std::atomic<int> runs{0};
  std::vector<std::vector<OwnedTensor>> saved(41);
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
      saved[step] = state;
      ++saves;
      // Fulls are 1, 5, ..., 21: with 22 newest the job keeps 22, 21 (its
      // chain) and 20, which it compacts so that 17..19 can go. Let it run
      // at least once then; the rest of the time it runs when it may.
      if (step == 22) {
        const int seen = runs;
        const absl::Time deadline = absl::Now() + absl::Seconds(60);
        while (runs < seen + 2 && absl::Now() < deadline) std::this_thread::yield();
      }
    }
    done = true;
  });
  RetentionPolicy policy;
  policy.keep_last = 3;
  policy.stale_temp_age = absl::Seconds(30);
  int compactions = 0;
  while (!done) {
    auto actions = RunRetention(root, policy);
    if (actions.ok()) {
      ++runs;
      for (const auto& a : *actions) {
        EXPECT_TRUE(a.error.empty()) << a.name << ": " << a.error;
        if (a.kind == Kind::kCompact && a.done) ++compactions;
      }
    } else {
      // Before the first save; or the engine opening holds the retention
      // lock for a moment while it reclaims orphans.
      EXPECT_TRUE(absl::IsInvalidArgument(actions.status()) || absl::IsNotFound(actions.status()) ||
                  absl::IsUnavailable(actions.status()))
          << actions.status();
    }
    if (saves > 0) {
      auto latest = Reader::Open(root, ReaderOptions{});
      EXPECT_TRUE(latest.ok()) << latest.status();
    }
  }
  writer.join();
  EXPECT_GT(runs, 0);
  EXPECT_GT(compactions, 0);
  ASSERT_TRUE(RunRetention(root, policy).ok());
  ExpectEveryStepRestores(root);
  const std::vector<int64_t> steps = *ListSteps(root);
  for (int64_t step : steps) testing::ExpectCheckpointEquals(root, step, saved[step]);
  auto latest = Reader::Open(root, ReaderOptions{});
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ((*latest)->step(), 40);
}


// The ckpt-retain command line, run in-process through `tools::RetainMain`
// (the binary's `main` only calls it).

struct CliResult {
  int code = -1;
  std::string out;
  std::string err;
};

std::ostream& operator<<(std::ostream& os, const CliResult& r) {
  return os << "exit " << r.code << "\n--- stdout:\n" << r.out << "--- stderr:\n" << r.err;
}

CliResult Retain(const std::vector<std::string>& args) {
  std::vector<const char*> argv = {"ckpt-retain"};
  for (const std::string& arg : args) argv.push_back(arg.c_str());
  std::ostringstream out, err;
  CliResult result;
  result.code = tools::RetainMain(static_cast<int>(argv.size()), argv.data(), out, err);
  result.out = out.str();
  result.err = err.str();
  return result;
}

// Each action of a run as "would delete step-...", without the reasons (a
// stale entry's reason carries its age, which moves between runs).
std::vector<std::string> Plan(const std::string& out) {
  std::vector<std::string> plan;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    plan.emplace_back(line.substr(0, line.find(" (")));
  }
  return plan;
}

std::vector<std::string> Cat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Every flag of ckpt-retain, in --help's order.
const std::vector<std::string> kRetainFlags = {"root",           "keep-last", "keep-every",
                                               "keep-newer-than", "cold-dir", "stale-temp-age",
                                               "compact",        "dry-run",   "json"};

// Fulls at 1 and 11, deltas between, LATEST = 13, and a save abandoned 2h ago
// (stale under the default --stale-temp-age of 1h).
void WriteCliRoot(const std::string& root) {
  WriteSteps(root, 10, 13);
  const std::string stale = root + "/.tmp-step-00000000000000000099-old";
  std::filesystem::create_directory(stale);
  std::filesystem::last_write_time(
      stale, std::filesystem::file_time_type::clock::now() - std::chrono::hours(2));
}

// Every flag works in its dashed form (as documented), with underscores (as
// before), and with its value joined by '=': the plans agree and show the
// flag took effect. All runs are dry runs, and the root is left as it was.
TEST(RetainCliTest, EveryFlagWorksDashedAndWithUnderscores) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  const std::string cold = dir.Join("cold");
  WriteCliRoot(root);
  std::filesystem::create_directory(cold);
  const auto snapshot = Snapshot(root);
  struct Case {
    std::string flag;
    std::vector<std::vector<std::string>> spellings;  // the same request, each way
    std::string present;  // how a line of the plan starts that shows the flag took effect
    std::string absent;   // ... or one it removes ("" when none)
    bool writer = false;  // run while a writer holds ROOT's lock
  };
  const std::string step1 = StepDirName(1);
  const std::string step4 = StepDirName(4);
  const std::vector<Case> cases = {
      {"root",
       {{"--root", root, "--keep-last", "3", "--dry-run"},
        {"--root=" + root, "--keep-last", "3", "--dry-run"},
        {"-root", root, "--keep-last", "3", "--dry-run"}},
       "would delete " + step1, ""},
      {"keep-last",
       {{"--keep-last", "3", "--dry-run"},
        {"--keep_last", "3", "--dry_run"},
        {"--keep-last=3", "--dry-run=true"},
        {"--keep_last=3", "--dry_run=true"}},
       "would delete " + step1, ""},
      {"keep-every",
       {{"--keep-every", "4", "--dry-run"},
        {"--keep_every", "4", "--dry_run"},
        {"--keep-every=4", "--dry-run"},
        {"--keep_every=4", "--dry_run"}},
       "would compact " + step4, ""},
      {"keep-newer-than",
       {{"--keep-newer-than", "24h", "--dry-run"},
        {"--keep_newer_than", "24h", "--dry_run"},
        {"--keep-newer-than=1440m", "--dry-run"},
        {"--keep_newer_than=24h", "--dry_run"}},
       "would keep " + step1, "would delete " + step1},
      {"cold-dir",
       {{"--keep-last", "3", "--cold-dir", cold, "--dry-run"},
        {"--keep_last", "3", "--cold_dir", cold, "--dry_run"},
        {"--keep-last", "3", "--cold-dir=" + cold, "--dry-run"},
        {"--keep_last", "3", "--cold_dir=" + cold, "--dry_run"}},
       "would move " + step1, "would delete " + step1},
      {"stale-temp-age",
       {{"--keep-last", "3", "--stale-temp-age", "3h", "--dry-run"},
        {"--keep_last", "3", "--stale_temp_age", "3h", "--dry_run"},
        {"--keep-last", "3", "--stale-temp-age=180m", "--dry-run"},
        {"--keep_last", "3", "--stale_temp_age=3h", "--dry_run"}},
       // The age matters only while a writer is alive: without one, every
       // save temp is a dead writer's and goes whatever its age.
       "would delete " + step1, "would remove-stale .tmp-step-00000000000000000099-old", true},
      {"compact",
       {{"--keep-every", "4", "--compact=false", "--dry-run"},
        {"--keep_every", "4", "--compact=false", "--dry_run"},
        {"--keep-every", "4", "--no-compact", "--dry-run"},
        {"--keep_every", "4", "--no_compact", "--dry_run"},
        {"--keep_every", "4", "--nocompact", "--dry_run"}},
       "would keep " + step1, "would compact " + step4},
      {"dry-run",
       {{"--keep-last", "3", "--dry-run"},
        {"--keep_last", "3", "--dry_run"},
        {"--keep-last", "3", "--dry-run=1"},
        {"--keep_last", "3", "--dry_run=yes"}},
       "would delete " + step1, ""},
      {"json",
       {{"--keep-last", "3", "--dry-run", "--json"},
        {"--keep_last", "3", "--dry_run", "--json"},
        {"--keep-last", "3", "--dry-run", "--json=true"}},
       R"({"action":"delete","done":false,"dry_run":true,"name":")" + step1, ""},
  };
  std::vector<std::string> covered;
  for (const Case& c : cases) {
    covered.push_back(c.flag);
    std::vector<std::string> first;
    for (const std::vector<std::string>& spelling : c.spellings) {
      const std::vector<std::string> args =
          c.flag == "root" ? spelling : Cat({"--root", root}, spelling);
      const std::string shown = absl::StrJoin(spelling, " ");
      absl::StatusOr<std::unique_ptr<FileLock>> writer;
      if (c.writer) writer = LockRoot(root, RootLockKind::kWriter, "a trainer");
      ASSERT_TRUE(!c.writer || writer.ok()) << writer.status();
      const CliResult r = Retain(args);
      ASSERT_EQ(r.code, 0) << shown << "\n" << r;
      const std::vector<std::string> plan = Plan(r.out);
      auto starts = [&plan](const std::string& prefix) {
        return std::any_of(plan.begin(), plan.end(), [&prefix](const std::string& line) {
          return absl::StartsWith(line, prefix);
        });
      };
      EXPECT_TRUE(starts(c.present)) << shown << ": no '" << c.present << "' in\n" << r.out;
      if (!c.absent.empty()) {
        EXPECT_FALSE(starts(c.absent)) << shown << ": '" << c.absent << "' in\n" << r.out;
      }
      if (first.empty()) {
        first = plan;
      } else {
        EXPECT_EQ(plan, first) << shown;
      }
    }
  }
  EXPECT_EQ(covered, kRetainFlags);  // every flag, nothing more
  EXPECT_TRUE(Snapshot(root) == snapshot);

  // And a real run, dashed.
  const CliResult r = Retain({"--root", root, "--keep-last", "3", "--stale-temp-age", "1h"});
  ASSERT_EQ(r.code, 0) << r;
  EXPECT_EQ(*ListSteps(root), (std::vector<int64_t>{11, 12, 13}));
  EXPECT_TRUE(Leftovers(root).empty());
}

TEST(RetainCliTest, HelpListsEveryFlagAndExitsZero) {
  for (const char* help : {"--help", "-h", "-help"}) {
    const CliResult r = Retain({"--keep-last", "3", help});
    ASSERT_EQ(r.code, 0) << help << "\n" << r;
    EXPECT_EQ(r.err, "");
    EXPECT_TRUE(absl::StrContains(r.out, "Usage:\n  ckpt-retain --root DIR")) << r.out;
    for (const std::string& flag : Cat(kRetainFlags, {"help"})) {
      // "  --flag" or "  --flag VALUE" on its own line, then its description.
      bool found = false;
      for (absl::string_view line : absl::StrSplit(r.out, '\n')) {
        if (line == "  --" + flag || absl::StartsWith(line, "  --" + flag + " ")) found = true;
      }
      EXPECT_TRUE(found) << "--" << flag << " missing from\n" << r.out;
      EXPECT_TRUE(absl::StrContains(r.out, "--" + flag + "\n      ") ||
                  absl::StrContains(r.out, "\n  --" + flag + " "))
          << flag;
    }
    for (absl::string_view line : absl::StrSplit(r.out, '\n')) {  // dashed names in the help
      if (absl::StartsWith(line, "  --")) EXPECT_FALSE(absl::StrContains(line, "_")) << line;
    }
    for (const char* code : {"\n  0  ", "\n  1  ", "\n  2  ", "\n  3  ", "\n  4  "}) {
      EXPECT_TRUE(absl::StrContains(r.out, code)) << code;
    }
  }
}

// A usage error is one line on stderr naming the flag and pointing at --help;
// exit 2, nothing printed on stdout, nothing changed.
void ExpectUsageError(const std::string& root, const std::vector<std::string>& args,
                      const std::string& message) {
  const CliResult r = Retain(Cat({"--root", root}, args));
  const std::string shown = absl::StrJoin(args, " ");
  EXPECT_EQ(r.code, 2) << shown << "\n" << r;
  EXPECT_EQ(r.out, "") << shown;
  EXPECT_TRUE(absl::StartsWith(r.err, "ckpt-retain: ")) << shown << "\n" << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, message)) << shown << ": no '" << message << "' in\n"
                                                 << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "--help")) << shown << "\n" << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << shown << "\n" << r.err;
}

TEST(RetainCliTest, UnknownOrMalformedFlagsExit2NamingTheFlag) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  WriteCliRoot(root);
  const auto snapshot = Snapshot(root);
  ExpectUsageError(root, {"--keep-lastt", "3"}, "unknown flag --keep-lastt");
  ExpectUsageError(root, {"--keep-last", "3", "--bogus"}, "unknown flag --bogus");
  ExpectUsageError(root, {"--keep-last", "3", "--step=4"}, "unknown flag --step");
  ExpectUsageError(root, {"--keep-last", "3", "--no-json=1"}, "--no-json takes no value");
  ExpectUsageError(root, {"--no-keep-last"}, "unknown flag --no-keep-last");
  ExpectUsageError(root, {"--keep-last=abc"}, "bad value 'abc' for --keep-last");
  ExpectUsageError(root, {"--keep_last", "abc"}, "bad value 'abc' for --keep_last");
  ExpectUsageError(root, {"--keep-last=3x"}, "bad value '3x' for --keep-last");
  ExpectUsageError(root, {"--keep-every=1.5"}, "bad value '1.5' for --keep-every");
  ExpectUsageError(root, {"--keep-every=99999999999999999999"}, "for --keep-every");
  ExpectUsageError(root, {"--keep-newer-than=soon"}, "bad value 'soon' for --keep-newer-than");
  ExpectUsageError(root, {"--keep-last", "3", "--stale-temp-age", "1"},
                   "bad value '1' for --stale-temp-age");
  ExpectUsageError(root, {"--keep-last", "3", "--compact=maybe"},
                   "bad value 'maybe' for --compact");
  ExpectUsageError(root, {"--keep-last", "3", "--dry-run=2"}, "bad value '2' for --dry-run");
  ExpectUsageError(root, {"--keep-last"}, "--keep-last needs a value");
  ExpectUsageError(root, {"--keep-last", "3", "--cold-dir"}, "--cold-dir needs a value");
  ExpectUsageError(root, {"--keep-last", "3", "extra"}, "unexpected argument 'extra'");
  ExpectUsageError(root, {"--keep-last", "-1"}, "must not be negative");
  ExpectUsageError(root, {"--dry-run"}, "give at least one of --keep-last");
  EXPECT_TRUE(Snapshot(root) == snapshot);
  const CliResult missing = Retain({"--keep-last", "3"});
  EXPECT_EQ(missing.code, 2) << missing;
  EXPECT_TRUE(absl::StrContains(missing.err, "--root DIR is required")) << missing;
  const CliResult nowhere = Retain({"--root", dir.Join("nope"), "--keep-last", "3"});
  EXPECT_EQ(nowhere.code, 3) << nowhere;
  std::filesystem::create_directory(dir.Join("empty"));
  const CliResult not_a_root = Retain({"--root", dir.Join("empty"), "--keep-last", "3"});
  EXPECT_EQ(not_a_root.code, 2) << not_a_root;
  EXPECT_TRUE(absl::StrContains(not_a_root.err, "not a checkpoint root")) << not_a_root;
}

TEST(RetainCliTest, AnUnusableLockFileIsNotAUsageError) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  WriteCliRoot(root);
  std::filesystem::remove(root + "/.ckpt-retain.lock");  // left by the engine that wrote ROOT
  std::filesystem::create_symlink(dir.Join("elsewhere"), root + "/.ckpt-retain.lock");
  const auto snapshot = Snapshot(root);
  const CliResult r = Retain({"--root", root, "--keep-last", "1"});
  EXPECT_EQ(r.code, 4) << r;
  EXPECT_TRUE(absl::StrContains(r.err, ".ckpt-retain.lock")) << r;
  EXPECT_TRUE(Snapshot(root) == snapshot);
}

TEST(FlagSetTest, ParsesTheWaysUsersTypeFlags) {
  tools::FlagSet set;
  int64_t keep = 0;
  bool dry = false;
  bool compact = true;
  std::string dir;
  absl::Duration age = absl::Hours(1);
  set.Add("keep-last", "N", &keep, "");
  set.Add("cold_dir", "DIR", &dir, "");  // registered with an underscore: shown dashed
  set.Add("stale-temp-age", "D", &age, "");
  set.AddBool("dry-run", &dry, "");
  set.AddBool("compact", &compact, "");
  EXPECT_EQ(set.Names(),
            (std::vector<std::string>{"keep-last", "cold-dir", "stale-temp-age", "dry-run",
                                      "compact"}));
  const char* argv[] = {"tool",   "a",          "--keep_last=1", "-keep-last", "7",
                        "--cold-dir", "--x",    "--dry_run",     "--no-compact",
                        "--stale_temp_age=90m", "--", "--keep-last=9", "b"};
  auto positional = set.Parse(static_cast<int>(std::size(argv)), argv);
  ASSERT_TRUE(positional.ok()) << positional.status();
  EXPECT_EQ(*positional, (std::vector<std::string>{"a", "--keep-last=9", "b"}));
  EXPECT_EQ(keep, 7);  // the last one wins
  EXPECT_EQ(dir, "--x");  // a value may start with a dash
  EXPECT_TRUE(dry);
  EXPECT_FALSE(compact);
  EXPECT_EQ(age, absl::Minutes(90));
  const char* again[] = {"tool", "--compact", "--dry-run=false"};
  ASSERT_TRUE(set.Parse(3, again).ok());
  EXPECT_TRUE(compact);
  EXPECT_FALSE(dry);
  const std::string help = set.Help();
  EXPECT_TRUE(absl::StrContains(help, "\n  --cold-dir DIR\n")) << help;
  EXPECT_TRUE(absl::StrContains(help, "\n  --dry-run\n")) << help;
  const char* bad[] = {"tool", "--keep-last=1e3"};
  auto error = set.Parse(2, bad);
  EXPECT_EQ(error.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(error.status().message(),
            "bad value '1e3' for --keep-last: expected an integer (see --help)");
}

}  // namespace
}  // namespace ckpt
