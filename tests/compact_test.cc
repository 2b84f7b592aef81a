// `CompactToFull`: a delta rewritten as a full checkpoint restores to exactly
// what the delta did, keeps every later delta of its chain working (on disk
// and from a running engine), and -- swept through the fault-injecting file
// system at every call -- either completes or leaves the delta untouched.
// (About 450 lines, over the house ~400: the fault sweep shares the
// chain-building fixture of the round-trip tests.)
#include "ckpt/compact.h"

#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ckpt/catalog.h"
#include "ckpt/engine.h"
#include "ckpt/reader.h"
#include "gtest/gtest.h"
#include "test_util.h"
#include "testing/fault_injection_file_system.h"

namespace ckpt {
namespace {

using testing::Leftovers;
using testing::Fault;
using testing::FaultInjectionFileSystem;
using testing::OwnedTensor;
using testing::RandomTensor;
using testing::ScratchDir;
using testing::Views;

const bool kQuietLog = (setenv("CKPT_LOG", "warning", /*overwrite=*/0), true);

using Restored = testing::RestoredStep;
using testing::ReadAllSteps;

std::string Diff(const std::string& root, const std::map<int64_t, Restored>& want) {
  return testing::DiffSteps(root, want);
}

EngineOptions ChainOptions(DeltaOptions::Mode mode) {
  EngineOptions options;
  options.io.chunk_bytes = 64 << 10;
  options.shard_min_bytes = 4096;  // a shard per module
  options.shard_max_bytes = 1 << 20;
  options.delta.mode = mode;
  // These tests are about chains of deltas: each against the one before.
  options.delta.base = DeltaOptions::Base::kChained;
  options.delta.max_restore_read_factor = 0;
  options.delta.full_every = 100;
  options.delta.topk_ratio = 0.05;
  return options;
}

CompactOptions SameShards() {
  CompactOptions options;
  options.shard_min_bytes = 4096;
  options.shard_max_bytes = 1 << 20;
  options.io.chunk_bytes = 64 << 10;
  return options;
}

std::vector<OwnedTensor> State() {
  return {RandomTensor("encoder.w", DType::kFloat32, {64, 129}, 1),
          RandomTensor("encoder.empty", DType::kFloat32, {0, 3}, 2),
          RandomTensor("encoder.odd", DType::kUInt8, {4095}, 3),
          RandomTensor("decoder.big", DType::kFloat32, {300, 1024}, 4),
          RandomTensor("decoder.scale", DType::kFloat64, {}, 5),
          RandomTensor("head.b", DType::kBFloat16, {1000}, 6)};
}

// Changes a few elements of every floating tensor (by small amounts, so
// top-k deltas drop some of the change).
void Step(std::vector<OwnedTensor>& state, std::mt19937_64& rng) {
  for (OwnedTensor& t : state) {
    if (t.dtype == DType::kFloat32) {
      auto* v = reinterpret_cast<float*>(t.bytes.data());
      const size_t n = t.bytes.size() / 4;
      for (size_t i = 0; i < n / 10 + 1 && n > 0; ++i) v[rng() % n] += 0.001f * (rng() % 100);
    } else if (t.dtype == DType::kUInt8) {
      for (int i = 0; i < 20; ++i) t.bytes[rng() % t.bytes.size()] ^= 0x11;
    }
  }
}

// What a test saved: step -> its tensors.
using Saved = std::map<int64_t, std::vector<OwnedTensor>>;

// Saves steps 1 (full) .. `last` (deltas, each on the previous) into `root`;
// what each step saved goes to `saved` when given.
void WriteChain(const std::string& root, DeltaOptions::Mode mode, int last, Saved* saved = nullptr) {
  auto engine = Engine::Open(root, ChainOptions(mode));
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::vector<OwnedTensor> state = State();
  std::mt19937_64 rng(7);
  for (int step = 1; step <= last; ++step) {
    Step(state, rng);
    auto stats = (*engine)->Save(step, Views(state), absl::StrCat(R"({"step": )", step, "}"));
    ASSERT_TRUE(stats.ok()) << stats.status();
    ASSERT_EQ(stats->kind, step == 1 ? CheckpointKind::kFull : CheckpointKind::kDelta) << "step " << step;
    if (saved != nullptr) (*saved)[step] = state;
  }
}

// Reads every step of `root` into `before`, checked against what the test
// saved (not against another read): bit for bit, top-k steps from the
// values (testing::DiffFromSaved).
std::string ReadAsSaved(const std::string& root, const Saved& saved, std::map<int64_t, Restored>* before) {
  std::string error = ReadAllSteps(root, before);
  return error.empty() ? testing::DiffFromSaved(*before, saved, ChainOptions(DeltaOptions::Mode::kTopK).delta.topk_ratio)
                       : error;
}

std::string FileContents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class CompactTest : public ::testing::TestWithParam<DeltaOptions::Mode> {};

TEST_P(CompactTest, DeltaBecomesFullWithTheSameValuesAndLaterDeltasStillApply) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  Saved saved;
  WriteChain(root, GetParam(), 5, &saved);
  std::map<int64_t, Restored> before;
  ASSERT_EQ(ReadAsSaved(root, saved, &before), "");
  auto old_summary = SummarizeCheckpoint(root, 3);
  ASSERT_TRUE(old_summary.ok());
  ASSERT_EQ(old_summary->kind, CheckpointKind::kDelta);
  const std::string latest = FileContents(root + "/LATEST");

  auto stats = CompactToFull(root, 3, SameShards());
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->swap, "exchange");
  EXPECT_EQ(stats->dir, root + "/" + StepDirName(3));

  auto summary = SummarizeCheckpoint(root, 3);
  ASSERT_TRUE(summary.ok());
  EXPECT_EQ(summary->kind, CheckpointKind::kFull);
  EXPECT_TRUE(summary->compacted);
  EXPECT_EQ(summary->compacted_from_manifest_xxh3, old_summary->manifest_xxh3);
  EXPECT_EQ(summary->created_unix_ns, old_summary->created_unix_ns);
  EXPECT_EQ(summary->max_error_bound, old_summary->max_error_bound);
  if (GetParam() == DeltaOptions::Mode::kTopK) EXPECT_GT(summary->max_error_bound, 0);
  EXPECT_EQ(Diff(root, before), "");
  EXPECT_EQ(FileContents(root + "/LATEST"), latest);
  EXPECT_TRUE(Leftovers(root).empty()) << absl::StrJoin(Leftovers(root), ", ");

  // Its bases can go now; 4 and 5 chain onto the compacted 3.
  testing::RemoveTree(root + "/" + StepDirName(1));
  testing::RemoveTree(root + "/" + StepDirName(2));
  before.erase(1);
  before.erase(2);
  EXPECT_EQ(Diff(root, before), "");
  auto newest = Reader::Open(root, ReaderOptions{});
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_EQ((*newest)->step(), 5);

  // A delta whose base was compacted compacts in turn.
  ASSERT_TRUE(CompactToFull(root, 4, SameShards()).ok());
  ASSERT_TRUE(CompactToFull(root, 5, SameShards()).ok());
  EXPECT_EQ(Diff(root, before), "");
}

TEST_P(CompactTest, ShardsAreThoseOfAFullSaveOfTheSameTensors) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  WriteChain(root, GetParam(), 3);
  auto reader = Reader::Open(root, ReaderOptions{.step = 3});
  ASSERT_TRUE(reader.ok());
  auto restored = (*reader)->ReadAll();
  ASSERT_TRUE(restored.ok());
  std::vector<OwnedTensor> tensors;
  for (const Tensor& t : *restored) {
    const auto* p = static_cast<const uint8_t*>(t.data());
    tensors.push_back(OwnedTensor{t.name, t.dtype, t.shape, std::vector<uint8_t>(p, p + t.nbytes())});
  }
  reader->reset();
  const std::string other = dir.Join("full");
  {
    EngineOptions options = ChainOptions(DeltaOptions::Mode::kNone);
    auto engine = Engine::Open(other, options);
    ASSERT_TRUE(engine.ok());
    ASSERT_TRUE((*engine)->Save(3, Views(tensors), R"({"step": 3})").ok());
  }
  ASSERT_TRUE(CompactToFull(root, 3, SameShards()).ok());
  auto compacted = Reader::Open(root, ReaderOptions{.step = 3});
  auto saved = Reader::Open(other, ReaderOptions{.step = 3});
  ASSERT_TRUE(compacted.ok() && saved.ok());
  ASSERT_EQ((*compacted)->tensors().size(), (*saved)->tensors().size());
  for (size_t i = 0; i < (*saved)->tensors().size(); ++i) {
    const TensorInfo& a = (*compacted)->tensors()[i];
    const TensorInfo& b = (*saved)->tensors()[i];
    EXPECT_EQ(a.name, b.name);
    EXPECT_EQ(a.shard, b.shard) << a.name;
    EXPECT_EQ(a.offset, b.offset) << a.name;
    EXPECT_EQ(a.encoding, RecordEncoding::kRaw);
    EXPECT_EQ(a.xxh3, b.xxh3) << a.name;
    EXPECT_EQ(a.dtype, b.dtype);
    EXPECT_EQ(a.shape, b.shape);
  }
  for (const auto& entry : std::filesystem::directory_iterator(other + "/" + StepDirName(3))) {
    const std::string name = entry.path().filename().string();
    if (name == "MANIFEST.json") continue;
    EXPECT_EQ(FileContents(entry.path()),
              FileContents(root + "/" + StepDirName(3) + "/" + name)) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(ExactAndTopK, CompactTest,
                         ::testing::Values(DeltaOptions::Mode::kExact, DeltaOptions::Mode::kTopK),
                         [](const auto& info) {
                           return info.param == DeltaOptions::Mode::kExact ? "Exact" : "TopK";
                         });

// The running engine's base is compacted under it: it keeps writing deltas
// against the values it holds, which the compacted base restores to.
TEST(CompactEngineTest, WriterKeepsSavingDeltasOnACompactedBase) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  auto engine = Engine::Open(root, ChainOptions(DeltaOptions::Mode::kExact));
  ASSERT_TRUE(engine.ok());
  std::vector<OwnedTensor> state = State();
  std::map<int64_t, std::vector<OwnedTensor>> saved;
  std::mt19937_64 rng(11);
  for (int step = 1; step <= 6; ++step) {
    Step(state, rng);
    auto stats = (*engine)->Save(step, Views(state));
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_EQ(stats->kind, step == 1 ? CheckpointKind::kFull : CheckpointKind::kDelta);
    saved[step] = state;
    if (step == 3) {
      ASSERT_TRUE(CompactToFull(root, 3).ok());
      testing::RemoveTree(root + "/" + StepDirName(1));
      testing::RemoveTree(root + "/" + StepDirName(2));
    }
  }
  EXPECT_EQ(*ListSteps(root), (std::vector<int64_t>{3, 4, 5, 6}));
  for (int64_t step : {3, 4, 5, 6}) testing::ExpectCheckpointEquals(root, step, saved[step]);
}

TEST(CompactEngineTest, IntoAnotherRootLeavesTheSourceAlone) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  const std::string cold = dir.Join("cold");
  std::filesystem::create_directory(cold);
  Saved saved;
  WriteChain(root, DeltaOptions::Mode::kExact, 3, &saved);
  std::map<int64_t, Restored> before;
  ASSERT_EQ(ReadAsSaved(root, saved, &before), "");
  CompactOptions options;
  options.target_root = cold;
  auto stats = CompactToFull(root, 3, options);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->swap, "");
  EXPECT_EQ(Diff(root, before), "");
  EXPECT_EQ(SummarizeCheckpoint(root, 3)->kind, CheckpointKind::kDelta);
  EXPECT_EQ(Diff(cold, {{3, before[3]}}), "");
  EXPECT_FALSE(std::filesystem::exists(cold + "/LATEST"));
  EXPECT_EQ(CompactToFull(root, 3, options).status().code(), absl::StatusCode::kAlreadyExists);
}

TEST(CompactEngineTest, RefusesFullAndMissingSteps) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  WriteChain(root, DeltaOptions::Mode::kExact, 2);
  auto full = CompactToFull(root, 1);
  EXPECT_EQ(full.status().code(), absl::StatusCode::kFailedPrecondition) << full.status();
  EXPECT_TRUE(absl::StrContains(full.status().message(), root));
  EXPECT_EQ(CompactToFull(root, 9).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Leftovers(root).empty());
}

TEST(CompactEngineTest, DamagedChainIsDataLossAndChangesNothing) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  WriteChain(root, DeltaOptions::Mode::kExact, 3);
  const std::string manifest = root + "/" + StepDirName(3) + "/MANIFEST.json";
  const std::string before = FileContents(manifest);
  // Flip a byte of a record of the full base.
  const std::string shard = root + "/" + StepDirName(1) + "/decoder.1.shard";
  ASSERT_TRUE(std::filesystem::exists(shard));
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x5a' ^ FileContents(shard)[100]);
  }
  auto stats = CompactToFull(root, 3);
  EXPECT_EQ(stats.status().code(), absl::StatusCode::kDataLoss) << stats.status();
  EXPECT_EQ(FileContents(manifest), before);
  EXPECT_TRUE(Leftovers(root).empty()) << absl::StrJoin(Leftovers(root), ", ");
}

// Where RENAME_EXCHANGE is missing: two renames, and the repair of a crash
// between them.
TEST(CompactEngineTest, WithoutExchangeTwoRenamesAndTheirRepair) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  Saved saved;
  WriteChain(root, DeltaOptions::Mode::kExact, 3, &saved);
  std::map<int64_t, Restored> before;
  ASSERT_EQ(ReadAsSaved(root, saved, &before), "");
  auto fs = std::make_shared<FaultInjectionFileSystem>(PosixFileSystem());
  fs->SetExchangeSupported(false);
  CompactOptions options;
  options.fs = fs;
  auto stats = CompactToFull(root, 3, options);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->swap, "rename");
  EXPECT_EQ(Diff(root, before), "");
  EXPECT_TRUE(Leftovers(root).empty()) << absl::StrJoin(Leftovers(root), ", ");

  // Interrupted between the renames: the old checkpoint is set aside and
  // step 2 is missing; the repair puts it back.
  const std::string aside = root + "/.compact-old-" + StepDirName(2) + "-0123456789abcdef";
  std::filesystem::rename(root + "/" + StepDirName(2), aside);
  ASSERT_TRUE(FinishInterruptedCompactions(root).ok());
  EXPECT_EQ(Diff(root, before), "");
  // Interrupted after them: the set-aside copy is removed.
  std::filesystem::copy(root + "/" + StepDirName(2), aside, std::filesystem::copy_options::recursive);
  ASSERT_TRUE(FinishInterruptedCompactions(root).ok());
  EXPECT_EQ(Diff(root, before), "");
  EXPECT_TRUE(Leftovers(root).empty()) << absl::StrJoin(Leftovers(root), ", ");
}

// ---------------------------------------------------------------------------
// The sweep: one fault at call n of a compaction of step 3 (of 1..4), for
// every n, with and without RENAME_EXCHANGE. Whatever happens, every step
// restores exactly as before; step 3 is the delta or its compaction, never
// anything else; an error leaves the delta and no temp directory behind.

std::string SweepBase() {
  if (getenv("TEST_TMPDIR") != nullptr) return "";
  std::error_code ec;
  return std::filesystem::is_directory("/dev/shm", ec) && access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "";
}

class CompactSweepTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    template_ = scratch_.Join("template");
    Saved saved;
    WriteChain(template_, DeltaOptions::Mode::kTopK, 4, &saved);
    ASSERT_EQ(ReadAsSaved(template_, saved, &before_), "");
    delta_hash_ = SummarizeCheckpoint(template_, 3)->manifest_xxh3;
    latest_ = FileContents(template_ + "/LATEST");
  }

  struct Run {
    std::string root;
    absl::Status status;
    std::string injected;
    absl::Status dropped;
  };

  Run CompactWithFault(uint64_t n, Fault fault, std::vector<std::string>* calls) {
    Run run;
    run.root = scratch_.Join(absl::StrCat("root", ++roots_));
    std::filesystem::copy(template_, run.root, std::filesystem::copy_options::recursive);
    auto fs = std::make_shared<FaultInjectionFileSystem>(PosixFileSystem());
    fs->SetExchangeSupported(GetParam());
    fs->RecordCalls(calls != nullptr);
    fs->FailAt(n, fault);
    CompactOptions options = SameShards();
    options.fs = fs;
    options.io.backend = IoBackend::kThreads;
    run.status = CompactToFull(run.root, 3, options).status();
    if (calls != nullptr) *calls = fs->recorded_calls();
    run.injected = fs->first_injected_call();
    if (fault == Fault::kCrash) {
      run.dropped = fs->DropUnsyncedData();
      // What the next ckpt-retain run does first.
      if (run.dropped.ok()) run.dropped = FinishInterruptedCompactions(run.root);
    }
    return run;
  }

  std::string Check(Fault fault, const Run& run) {
    if (!run.dropped.ok()) return absl::StrCat("after the crash: ", run.dropped.ToString());
    std::string diff = Diff(run.root, before_);
    if (!diff.empty()) return diff;
    if (FileContents(run.root + "/LATEST") != latest_) return "LATEST changed";
    auto summary = SummarizeCheckpoint(run.root, 3);
    if (!summary.ok()) return summary.status().ToString();
    const bool original = summary->manifest_xxh3 == delta_hash_;
    const bool compacted = summary->compacted && summary->compacted_from_manifest_xxh3 == delta_hash_;
    if (!original && !compacted) return "step 3 is neither the delta nor its compaction";
    if (fault == Fault::kCrash) return "";
    if (run.status.ok()) return compacted ? "" : "succeeded but step 3 is still the delta";
    if (!original) return absl::StrCat("failed (", run.status.ToString(), ") but step 3 was replaced");
    if (!absl::StrContains(run.status.message(), run.root)) {
      return absl::StrCat("the error names no path: ", run.status.ToString());
    }
    if (fault == Fault::kEnospc && !absl::IsResourceExhausted(run.status) &&
        !absl::StrContains(run.status.message(), "ENOSPC")) {
      return absl::StrCat("ENOSPC reported as ", run.status.ToString());
    }
    std::vector<std::string> left = Leftovers(run.root);
    if (!left.empty()) return absl::StrCat("left behind: ", absl::StrJoin(left, ", "));
    return "";
  }

  void Sweep(Fault fault, bool io_ops_only) {
    std::vector<std::string> calls;
    Run clean = CompactWithFault(0, Fault::kNone, &calls);
    ASSERT_TRUE(clean.status.ok()) << clean.status;
    ASSERT_EQ(Check(Fault::kNone, clean), "");
    ASSERT_GT(calls.size(), 40u);
    std::vector<std::string> problems;
    int completed = 0, untouched = 0;
    for (uint64_t n = 1; n <= calls.size() && problems.size() < 20; ++n) {
      if (io_ops_only && !testing::IsTransferCall(calls[n - 1])) continue;
      Run run = CompactWithFault(n, fault, nullptr);
      std::string problem = Check(fault, run);
      if (!problem.empty()) {
        problems.push_back(absl::StrCat(testing::FaultName(fault), " at call ", n, "/", calls.size(),
                                        " (", run.injected, "): ", problem));
      }
      (SummarizeCheckpoint(run.root, 3)->compacted ? completed : untouched)++;
      testing::RemoveTree(run.root);
    }
    EXPECT_TRUE(problems.empty()) << problems.size() << " bad runs (at most 20 shown):\n"
                                  << absl::StrJoin(problems, "\n");
    if (!io_ops_only) EXPECT_GT(untouched, 0);
    EXPECT_GT(completed, 0);
  }

  ScratchDir scratch_{"ckpt-compact-sweep", SweepBase()};
  std::string template_;
  std::map<int64_t, Restored> before_;
  uint64_t delta_hash_ = 0;
  std::string latest_;
  int roots_ = 0;
};

TEST_P(CompactSweepTest, CrashAtEveryCallLeavesTheDeltaOrItsCompaction) {
  Sweep(Fault::kCrash, /*io_ops_only=*/false);
}

TEST_P(CompactSweepTest, EioAtEveryCallFailsCleanlyOrCompletes) {
  Sweep(Fault::kEio, /*io_ops_only=*/false);
}

TEST_P(CompactSweepTest, EnospcAtEveryCallFailsCleanlyOrCompletes) {
  Sweep(Fault::kEnospc, /*io_ops_only=*/false);
}

TEST_P(CompactSweepTest, ShortTransfersAreRetried) {
  Sweep(Fault::kShortTransfer, /*io_ops_only=*/true);
}

INSTANTIATE_TEST_SUITE_P(ExchangeOrRenames, CompactSweepTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Exchange" : "Renames"; });

}  // namespace
}  // namespace ckpt
