// Fault sweeps over the save modes that carry state from one save to the
// next: exact and top-k deltas (the engine's reference state), lazy staging
// (the copy runs after `SaveAsync` returned) and both together, with and
// without zstd, on both I/O backends.
//
// Every run: a fresh root, an engine over `FaultInjectionFileSystem` saves
// step 1 (full) cleanly, then step 2 -- a delta of step 1, or a lazy save --
// with one fault armed at its n-th call, for every n a clean step-2 save
// makes. Then, depending on the fault:
// - kCrash: after dropping what a power loss drops, the root restores
//   exactly as a clean run's steps {1} or {1, 2}: never a mix, a damaged
//   step, or a delta without its base. A new engine then saves step 3.
// - kEio, kEnospc: the save fails naming a path (ENOSPC as
//   kResourceExhausted); step 1 is untouched and nothing of step 2 is left.
//   The same engine then saves step 3, which must be a *full* checkpoint (the
//   reference state may be half updated by the failed save) and restore
//   exactly.
// - kShortTransfer, kEintr (transfers only: I/O ops, ReadAt, WriteAt):
//   retried; step 2 commits as in the clean run (a delta stays a delta).
#include <stdlib.h>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "ckpt/catalog.h"
#include "ckpt/engine.h"
#include "ckpt/file_system.h"
#include "gtest/gtest.h"
#include "test_util.h"
#include "testing/fault_injection_file_system.h"

namespace ckpt {
namespace {

using testing::Fault;
using testing::FaultInjectionFileSystem;
using testing::OwnedTensor;
using testing::RandomTensor;
using testing::RestoredStep;
using testing::ScratchDir;

const bool kQuietLog = (setenv("CKPT_LOG", "warning", /*overwrite=*/0), true);

constexpr absl::Duration kDeadline = absl::Seconds(60);

struct ModeConfig {
  const char* name;
  DeltaOptions::Mode delta;
  bool lazy;
  int zstd_level;
  IoBackend backend;
};

void PrintTo(const ModeConfig& config, std::ostream* os) { *os << config.name; }

// Step 1: random tensors in three modules (edge sizes and one of 1 MiB);
// each later step changes about 1 % of the elements of the float tensors and
// one byte of the small ones, so that a delta pays for itself.
const std::vector<OwnedTensor>& StepTensors(int64_t step) {
  static const auto* steps = [] {
    auto* m = new std::map<int64_t, std::vector<OwnedTensor>>();
    std::vector<OwnedTensor> t = {
        RandomTensor("embed.weight", DType::kFloat32, {512, 512}, 11),
        RandomTensor("embed.count", DType::kInt64, {}, 12),
        RandomTensor("block.0.w", DType::kBFloat16, {300, 70}, 13),
        RandomTensor("block.0.empty", DType::kFloat32, {0}, 14),
        RandomTensor("block.0.odd", DType::kUInt8, {4097}, 15),
        RandomTensor("head.w", DType::kFloat16, {33, 17}, 16),
        RandomTensor("head.scale", DType::kFloat64, {3}, 17),
    };
    (*m)[1] = t;
    for (int64_t s = 2; s <= 3; ++s) {
      for (OwnedTensor& x : t) {
        if (x.bytes.empty()) continue;
        const size_t stride = std::max<size_t>(1, x.bytes.size() / 97);
        for (size_t i = static_cast<size_t>(s); i < x.bytes.size(); i += stride) x.bytes[i] ^= 0x5a;
      }
      (*m)[s] = t;
    }
    return m;
  }();
  return steps->at(step);
}

std::string Extras(int64_t step) { return absl::StrCat(R"({"step": )", step, "}"); }

EngineOptions Options(std::shared_ptr<FileSystem> fs, const ModeConfig& config) {
  EngineOptions options = testing::SmallChunks();
  options.fs = std::move(fs);
  options.io.backend = config.backend;
  options.io.queue_depth = 8;
  options.compression_level = config.zstd_level;
  options.lazy_staging = config.lazy;
  options.delta.mode = config.delta;
  options.delta.topk_ratio = 0.02;
  options.delta.full_every = 100;
  options.shard_min_bytes = 4096;
  options.shard_max_bytes = 1 << 20;
  return options;
}

// Saves `step` through `engine` (lazily staged saves wait for staging first,
// as a training loop does), under a deadline.
absl::StatusOr<SaveStats> SaveStep(Engine& engine, int64_t step) {
  absl::StatusOr<std::shared_ptr<SaveHandle>> handle;
  testing::RunOrDie([&] { handle = engine.SaveAsync(step, testing::Views(StepTensors(step)), Extras(step)); },
                    kDeadline, absl::StrCat("SaveAsync of step ", step));
  if (!handle.ok()) return handle.status();
  absl::Status staged = testing::WaitStagedOrDie(**handle, kDeadline, "staging");
  absl::Status done = testing::WaitOrDie(**handle, kDeadline, absl::StrCat("save of step ", step));
  if (!done.ok()) return done;
  if (!staged.ok()) return staged;
  return (*handle)->stats();
}

// "" if `got` holds `step` restoring to exactly its tensors.
std::string Exact(std::map<int64_t, RestoredStep>& got, int64_t step) {
  if (got.count(step) == 0) return absl::StrCat("step ", step, " is missing");
  for (const OwnedTensor& t : StepTensors(step)) {
    if (got[step].bytes[t.name] != std::string(t.bytes.begin(), t.bytes.end())) {
      return absl::StrCat("step ", step, " ", t.name, " does not restore exactly");
    }
  }
  return "";
}

class SaveModesFaultSweepTest : public ::testing::TestWithParam<ModeConfig> {
 protected:
  struct Run {
    std::string root;
    absl::Status status;   // of saving step 2
    std::optional<CheckpointKind> kind2;  // its kind, when it committed
    std::string injected;  // the call the fault hit, "" if none
    absl::Status dropped;  // DropUnsyncedData after a crash
    absl::StatusOr<SaveStats> next = absl::UnknownError("not run");  // step 3, same engine
  };

  void SetUp() override {
    if (GetParam().backend == IoBackend::kUring) {
      auto uring = PosixFileSystem()->NewIoQueue(IoQueueKind::kUring, 4);
      // Skipped only where io_uring is unavailable (the kernel or a seccomp
      // policy refuses it); any other error fails the sweep.
      if (!uring.ok() && absl::IsUnavailable(uring.status())) {
        CKPT_SKIP_UNLESS_REQUIRED(absl::StrCat("io_uring unavailable here: ", uring.status().ToString()));
      }
      ASSERT_TRUE(uring.ok()) << uring.status();
    }
    // tests/full_disk/run.sh runs these sweeps on ext4 to cross the
    // O_DIRECT path (/dev/shm refuses it): there, a clean save must say it
    // wrote with O_DIRECT, or the run proves nothing more than the tmpfs one.
    if (const char* expect = getenv("CKPT_EXPECT_O_DIRECT"); expect != nullptr && std::string(expect) == "1") {
      const std::string root = scratch_.Join("direct-probe");
      auto engine = Engine::Open(root, Options(PosixFileSystem(), GetParam()));
      ASSERT_TRUE(engine.ok()) << engine.status();
      auto stats = SaveStep(**engine, 1);
      ASSERT_TRUE(stats.ok()) << stats.status();
      ASSERT_TRUE(absl::StrContains(stats->backend, "O_DIRECT")) << "saves here use " << stats->backend;
      ASSERT_TRUE((*engine)->Close().ok());
      testing::RemoveTree(root);
    }
  }

  // Saves step 1 cleanly, then step 2 with `fault` at its call `n` (n == 0:
  // none), then -- unless the file system crashed -- step 3 with the fault
  // cleared, through the same engine.
  Run SaveWithFault(uint64_t n, Fault fault, std::vector<std::string>* calls = nullptr) {
    Run run;
    run.root = scratch_.Join(absl::StrCat("root", ++roots_));
    auto fs = std::make_shared<FaultInjectionFileSystem>(PosixFileSystem());
    {
      auto engine = Engine::Open(run.root, Options(fs, GetParam()));
      if (!engine.ok()) {
        run.status = engine.status();
        return run;
      }
      absl::StatusOr<SaveStats> first = SaveStep(**engine, 1);
      if (!first.ok()) {
        run.status = absl::InternalError(absl::StrCat("clean step 1: ", first.status().ToString()));
        return run;
      }
      fs->ResetCallCount();
      fs->RecordCalls(calls != nullptr);
      fs->FailAt(n, fault);
      absl::StatusOr<SaveStats> second = SaveStep(**engine, 2);
      run.status = second.status();
      if (second.ok()) run.kind2 = second->kind;
      if (calls != nullptr) *calls = fs->recorded_calls();
      run.injected = fs->first_injected_call();
      if (!fs->crashed()) {
        fs->ClearFaults();
        run.next = SaveStep(**engine, 3);
      }
    }
    if (fault == Fault::kCrash) run.dropped = fs->DropUnsyncedData();
    return run;
  }

  // The clean run: how many calls step 2 makes, and what steps 1-3 restore
  // to (top-k deltas restore approximately: the clean run is the reference).
  void LearnCleanRun() {
    Run run = SaveWithFault(0, Fault::kNone, &clean_calls_);
    ASSERT_TRUE(run.status.ok()) << run.status;
    ASSERT_TRUE(run.next.ok()) << run.next.status();
    const bool delta = GetParam().delta != DeltaOptions::Mode::kNone;
    ASSERT_EQ(run.kind2, delta ? CheckpointKind::kDelta : CheckpointKind::kFull) << "the clean step 2 is not what the sweep tests";
    ASSERT_EQ(run.next->kind, delta ? CheckpointKind::kDelta : CheckpointKind::kFull);
    ASSERT_EQ(testing::ReadAllSteps(run.root, &clean_), "");
    if (GetParam().delta != DeltaOptions::Mode::kTopK) {
      for (int64_t step : {1, 2, 3}) {
        for (const OwnedTensor& t : StepTensors(step)) {
          ASSERT_EQ(clean_[step].bytes[t.name], std::string(t.bytes.begin(), t.bytes.end()))
              << "step " << step << " " << t.name << " does not restore exactly";
        }
      }
    }
    testing::RemoveTree(run.root);
  }

  // `clean_` restricted to `steps`.
  std::map<int64_t, RestoredStep> CleanSteps(std::initializer_list<int64_t> steps) const {
    std::map<int64_t, RestoredStep> want;
    for (int64_t s : steps) want[s] = clean_.at(s);
    return want;
  }

  // A failed step 2: only step 1 restores; step 3 committed as a full
  // checkpoint beside it and restores as in the clean run (for top-k, a full
  // step 3 is exact: compared with the tensors themselves).
  std::string CheckFailedThenFull(Fault fault, const Run& run) {
    // Two calls whose failure is no failed save: the check that the base of
    // the delta still exists (unsure, the engine writes a full checkpoint
    // instead), and the check that step 2 does not exist yet (`SaveAsync`
    // refuses the save before it starts: nothing changed, and step 3 may be a
    // delta of step 1).
    const std::string base_check = absl::StrCat("stat ", run.root, "/", StepDirName(1));
    const std::string exists_check = absl::StrCat("stat ", run.root, "/", StepDirName(2));
    if (absl::StartsWith(run.injected, base_check)) {
      if (!run.status.ok()) return absl::StrCat("the base check failed the save: ", run.status.ToString());
      if (run.kind2 != CheckpointKind::kFull) {
        return absl::StrCat("unsure of its base, step 2 is a ", testing::KindName(run.kind2));
      }
      std::map<int64_t, RestoredStep> got;
      if (std::string e = testing::ReadAllSteps(run.root, &got); !e.empty()) return e;
      for (int64_t step : {1, 2}) {
        if (std::string e = Exact(got, step); !e.empty()) return e;
      }
      return "";
    }
    const bool refused = absl::StartsWith(run.injected, exists_check);
    if (run.status.ok()) return "step 2 committed although a call it needs failed";
    if (fault == Fault::kEnospc && !absl::IsResourceExhausted(run.status)) {
      return absl::StrCat("ENOSPC reported as ", run.status.ToString());
    }
    if (!absl::StrContains(run.status.message(), run.root)) {
      return absl::StrCat("the error names no path: ", run.status.ToString());
    }
    if (!run.next.ok()) return absl::StrCat("step 3 after the failure: ", run.next.status().ToString());
    if (run.next->kind != CheckpointKind::kFull && !refused) {
      return absl::StrCat("step 3 after a failed save is a ", testing::KindName(run.next->kind),
                          ", not a full checkpoint");
    }
    std::map<int64_t, RestoredStep> want = CleanSteps({1});
    std::map<int64_t, RestoredStep> got;
    if (std::string e = testing::ReadAllSteps(run.root, &got); !e.empty()) return e;
    if (got.count(2) != 0) return "step 2 is visible";
    // (A top-k delta of step 1 -- after a refused save -- restores only
    // within its bound, which ReadAllSteps checked.)
    const bool approximate = run.next->kind == CheckpointKind::kDelta && GetParam().delta == DeltaOptions::Mode::kTopK;
    if (!approximate) {
      if (std::string e = Exact(got, 3); !e.empty()) return e;
    }
    got.erase(3);
    std::map<int64_t, RestoredStep> only1;
    only1[1] = got[1];
    if (only1[1].bytes != want[1].bytes) return "step 1 changed";
    std::vector<std::string> left = testing::Leftovers(run.root);
    if (!left.empty()) return absl::StrCat("left behind: ", absl::StrJoin(left, ", "));
    return "";
  }

  // A retried fault: step 2 (and 3) committed as in the clean run.
  std::string CheckRetried(const Run& run) const {
    const bool delta = GetParam().delta != DeltaOptions::Mode::kNone;
    if (!run.status.ok()) return absl::StrCat("step 2 failed: ", run.status.ToString());
    if (run.kind2 != (delta ? CheckpointKind::kDelta : CheckpointKind::kFull)) {
      return absl::StrCat("step 2 became a ", testing::KindName(run.kind2));
    }
    if (!run.next.ok()) return absl::StrCat("step 3: ", run.next.status().ToString());
    return testing::DiffSteps(run.root, clean_);
  }

  void Sweep(Fault fault, const std::function<std::string(uint64_t, const Run&)>& check) {
    LearnCleanRun();
    if (HasFatalFailure()) return;
    const uint64_t total = clean_calls_.size();
    ASSERT_GT(total, 20u) << "step 2 makes suspiciously few calls";
    const bool io_only = fault == Fault::kShortTransfer || fault == Fault::kEintr;
    std::vector<std::string> problems;
    size_t runs = 0;
    for (uint64_t n = 1; n <= total && problems.size() < 20; ++n) {
      if (io_only && !testing::IsTransferCall(clean_calls_[n - 1])) continue;
      Run run = SaveWithFault(n, fault);
      ++runs;
      std::string problem = check(n, run);
      if (!problem.empty()) {
        problems.push_back(absl::StrCat(testing::FaultName(fault), " at call ", n, "/", total, " (",
                                        run.injected.empty() ? "not injected" : run.injected,
                                        "): ", problem));
      }
      testing::RemoveTree(run.root);
    }
    EXPECT_GT(runs, 0u);
    EXPECT_TRUE(problems.empty()) << problems.size() << " bad runs (at most 20 shown):\n"
                                  << absl::StrJoin(problems, "\n");
  }

  ScratchDir scratch_{"ckpt-modes-sweep", testing::SweepScratchBase()};
  int roots_ = 0;
  std::vector<std::string> clean_calls_;
  std::map<int64_t, RestoredStep> clean_;
};

TEST_P(SaveModesFaultSweepTest, CrashAtEveryCallLeavesStepOneOrStepTwoWhole) {
  int saw_old = 0, saw_new = 0;
  Sweep(Fault::kCrash, [&](uint64_t n, const Run& run) -> std::string {
    if (run.status.ok()) return "step 2 committed although the file system crashed";
    if (!run.dropped.ok()) return absl::StrCat("DropUnsyncedData: ", run.dropped.ToString());
    auto steps = ListSteps(run.root);
    if (!steps.ok()) return steps.status().ToString();
    const bool has2 = std::find(steps->begin(), steps->end(), 2) != steps->end();
    (has2 ? saw_new : saw_old)++;
    std::string diff = testing::DiffSteps(run.root, has2 ? CleanSteps({1, 2}) : CleanSteps({1}));
    if (!diff.empty()) return diff;
    // Recovery, sampled: a new engine over what the crash left saves step 3
    // (a delta against what it read back of the newest step that survived,
    // or full) and it restores exactly.
    if (n % 5 == 0) {
      auto engine = Engine::Open(run.root, Options(nullptr, GetParam()));
      if (!engine.ok()) return absl::StrCat("reopening: ", engine.status().ToString());
      absl::StatusOr<SaveStats> next = SaveStep(**engine, 3);
      if (!next.ok()) return absl::StrCat("step 3 after the crash: ", next.status().ToString());
      engine->reset();
      std::map<int64_t, RestoredStep> got;
      if (std::string e = testing::ReadAllSteps(run.root, &got); !e.empty()) return e;
      // (A top-k delta restores only within its bound, which ReadAllSteps checked.)
      const bool approximate = next->kind == CheckpointKind::kDelta && GetParam().delta == DeltaOptions::Mode::kTopK;
      if (!approximate) {
        if (std::string e = Exact(got, 3); !e.empty()) return e;
      }
      if (!testing::Leftovers(run.root).empty()) {
        return absl::StrCat("the new engine left ", absl::StrJoin(testing::Leftovers(run.root), ", "));
      }
    }
    return "";
  });
  EXPECT_GT(saw_old, 0) << "no crash kept step 1 alone";
  EXPECT_GT(saw_new, 0) << "no crash after the commit point";
}

TEST_P(SaveModesFaultSweepTest, EioAtEveryCallFailsAndTheNextSaveIsFull) {
  Sweep(Fault::kEio, [&](uint64_t, const Run& run) { return CheckFailedThenFull(Fault::kEio, run); });
}

TEST_P(SaveModesFaultSweepTest, EnospcAtEveryCallIsResourceExhaustedAndTheNextSaveIsFull) {
  Sweep(Fault::kEnospc,
        [&](uint64_t, const Run& run) { return CheckFailedThenFull(Fault::kEnospc, run); });
}

TEST_P(SaveModesFaultSweepTest, ShortTransferAtEveryIoOpIsRetried) {
  Sweep(Fault::kShortTransfer, [&](uint64_t, const Run& run) { return CheckRetried(run); });
}

TEST_P(SaveModesFaultSweepTest, EintrAtEveryIoOpIsRetried) {
  Sweep(Fault::kEintr, [&](uint64_t, const Run& run) { return CheckRetried(run); });
}

INSTANTIATE_TEST_SUITE_P(
    Modes, SaveModesFaultSweepTest,
    ::testing::Values(ModeConfig{"ExactDelta", DeltaOptions::Mode::kExact, false, 0, IoBackend::kThreads},
                      ModeConfig{"ExactDeltaUring", DeltaOptions::Mode::kExact, false, 0, IoBackend::kUring},
                      ModeConfig{"ExactDeltaZstd", DeltaOptions::Mode::kExact, false, 3, IoBackend::kThreads},
                      ModeConfig{"TopKDelta", DeltaOptions::Mode::kTopK, false, 0, IoBackend::kThreads},
                      ModeConfig{"Lazy", DeltaOptions::Mode::kNone, true, 0, IoBackend::kThreads},
                      ModeConfig{"LazyUring", DeltaOptions::Mode::kNone, true, 0, IoBackend::kUring},
                      ModeConfig{"LazyExactDelta", DeltaOptions::Mode::kExact, true, 0, IoBackend::kThreads},
                      ModeConfig{"LazyTopKDeltaZstd", DeltaOptions::Mode::kTopK, true, 3, IoBackend::kThreads}),
    [](const ::testing::TestParamInfo<ModeConfig>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace ckpt
