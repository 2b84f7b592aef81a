// Fault sweeps over what changes a root from outside the engine: a
// retention run (compaction, deletion, moving to a cold tier, removal of
// stale temp directories) and a safetensors export.
//
// Each run starts from a copy of one template root (exact deltas, several
// chains) with one fault armed at call n of a clean run, for every n. After
// it, with a clean file system:
// - every checkpoint listed in ROOT or in the cold tier restores to exactly
//   the values the template's step had (a half-deleted or half-copied step is
//   never listed; a delta in the cold tier has its chain there);
// - every step the clean run keeps in ROOT is still in ROOT, and no step is
//   lost that the policy does not delete;
// - EIO/ENOSPC make the run report the failure (ENOSPC as
//   kResourceExhausted), and a second, clean run converges to what the clean
//   run leaves, with no debris in ROOT;
// - a crash (power loss) at any call is the same, after what was not durable
//   is dropped.
// The export must leave either nothing or the complete file.
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/time.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ckpt/catalog.h"
#include "ckpt/engine.h"
#include "ckpt/maintenance.h"
#include "ckpt/reader.h"
#include "ckpt/safetensors.h"
#include "gtest/gtest.h"
#include "retain/retention.h"
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
using tools::RetentionAction;
using tools::RetentionPolicy;
using tools::RunRetention;

const bool kQuietLog = (setenv("CKPT_LOG", "error", /*overwrite=*/0), true);

constexpr int kSteps = 8;  // full: 1, 4, 7; deltas: the rest

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Entries of `dir` that are not checkpoints, LATEST or lock files.
std::vector<std::string> Debris(const std::string& dir) {
  std::error_code ec;
  if (!std::filesystem::exists(dir, ec)) return {};
  return testing::Leftovers(dir);
}

// Sets the times of `path` to 2001, as a directory untouched for years has.
void MakeStale(const std::string& path) {
  struct timeval old[2] = {{1000000000, 0}, {1000000000, 0}};
  ASSERT_EQ(::utimes(path.c_str(), old), 0) << path;
}

class MaintenanceFaultSweepTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    template_dir_ = new ScratchDir("ckpt-maint-template", testing::SweepScratchBase());
    const std::string root = template_dir_->Join("root");
    EngineOptions options = testing::SmallChunks();
    options.delta.mode = DeltaOptions::Mode::kExact;
    // These tests are about chains of deltas: each against the one before.
    options.delta.base = DeltaOptions::Base::kChained;
    options.delta.max_restore_read_factor = 0;
    options.delta.full_every = 3;
    auto engine = Engine::Open(root, options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    std::vector<OwnedTensor> state = {RandomTensor("m.w", DType::kFloat32, {64, 1024}, 1),
                                      RandomTensor("m.b", DType::kBFloat16, {999}, 2),
                                      RandomTensor("head.w", DType::kFloat16, {33, 17}, 3)};
    std::mt19937_64 rng(7);
    for (int step = 1; step <= kSteps; ++step) {
      for (OwnedTensor& t : state) {
        for (int i = 0; i < 40; ++i) t.bytes[rng() % t.bytes.size()] ^= 0x5A;
      }
      ASSERT_TRUE((*engine)->Save(step, testing::Views(state)).ok());
    }
    engine->reset();
    // A stale temp directory of a save that died long ago.
    const std::string stale = root + "/.tmp-step-00000000000000000099-00000000deadbeef";
    std::filesystem::create_directory(stale);
    std::ofstream(stale + "/x.shard") << "partial";
    MakeStale(stale + "/x.shard");
    MakeStale(stale);
    template_steps_ = new std::map<int64_t, RestoredStep>();
    ASSERT_EQ(testing::ReadAllSteps(root, template_steps_), "");
    ASSERT_EQ(template_steps_->size(), static_cast<size_t>(kSteps));
  }
  static void TearDownTestSuite() {
    delete template_steps_;
    delete template_dir_;
  }

  struct Run {
    std::string root, cold;
    absl::Status status;  // the run's own error, or the first action's
    std::string injected;
    absl::Status dropped;
  };

  // What a policy does; `cold` moves instead of deleting.
  RetentionPolicy Policy(bool cold, const std::string& cold_dir,
                         std::shared_ptr<FileSystem> fs = nullptr) const {
    RetentionPolicy policy;
    policy.keep_last = 2;
    policy.keep_every = 4;  // keeps 4 and 8, and 4's base... 4 is full
    if (cold) policy.cold_dir = cold_dir;
    policy.fs = std::move(fs);
    return policy;
  }

  Run RetainWithFault(bool cold, uint64_t n, Fault fault, std::vector<std::string>* calls = nullptr) {
    Run run;
    const std::string base = scratch_.Join(absl::StrCat("run", ++runs_));
    std::filesystem::create_directory(base);
    run.root = base + "/root";
    run.cold = base + "/cold";
    std::filesystem::copy(template_dir_->Join("root"), run.root, std::filesystem::copy_options::recursive);
    // copy() does not keep times: make the planted temp directory stale again.
    for (const std::string& name : Debris(run.root)) {
      const std::string p = run.root + "/" + name;
      for (const auto& e : std::filesystem::directory_iterator(p)) MakeStale(e.path().string());
      MakeStale(p);
    }
    std::filesystem::create_directory(run.cold);
    auto fs = std::make_shared<FaultInjectionFileSystem>(PosixFileSystem());
    fs->RecordCalls(calls != nullptr);
    fs->FailAt(n, fault);
    auto actions = RunRetention(run.root, Policy(cold, run.cold, fs));
    run.status = actions.status();
    if (actions.ok()) {
      for (const RetentionAction& a : *actions) {
        if (a.error.empty()) continue;
        if (run.status.ok()) run.status = absl::InternalError(a.name + ": " + a.error);
        // ENOSPC must stay recognisable in what the action reports.
        if (absl::StrContains(a.error, "ENOSPC")) {
          run.status = absl::ResourceExhaustedError(a.name + ": " + a.error);
        }
      }
    }
    if (calls != nullptr) *calls = fs->recorded_calls();
    run.injected = fs->first_injected_call();
    if (fault == Fault::kCrash) run.dropped = fs->DropUnsyncedData();
    return run;
  }

  // Every checkpoint in `dir` restores as the template's step did.
  static std::string CheckRestoresAsTemplate(const std::string& dir, std::set<int64_t>* steps) {
    std::map<int64_t, RestoredStep> got;
    if (std::string e = testing::ReadAllSteps(dir, &got); !e.empty()) return absl::StrCat(dir, ": ", e);
    for (const auto& [step, r] : got) {
      auto it = template_steps_->find(step);
      if (it == template_steps_->end()) return absl::StrCat(dir, " holds a step ", step, " nobody saved");
      if (it->second.bytes != r.bytes) return absl::StrCat(dir, " step ", step, " restores other values");
      steps->insert(step);
    }
    return "";
  }

  struct Outcome {
    std::set<int64_t> hot, cold;
  };

  std::string Check(const Run& run, Outcome* outcome) {
    if (std::string e = CheckRestoresAsTemplate(run.root, &outcome->hot); !e.empty()) return e;
    if (std::string e = CheckRestoresAsTemplate(run.cold, &outcome->cold); !e.empty()) return e;
    for (int64_t step : clean_.hot) {
      if (outcome->hot.count(step) == 0) return absl::StrCat("kept step ", step, " left ROOT");
    }
    for (const auto& [step, r] : *template_steps_) {
      if (outcome->hot.count(step) == 0 && outcome->cold.count(step) == 0 &&
          (clean_.hot.count(step) != 0 || clean_.cold.count(step) != 0)) {
        return absl::StrCat("step ", step, " is lost: in neither ROOT nor the cold tier");
      }
    }
    return "";
  }

  void LearnClean(bool cold) {
    Run run = RetainWithFault(cold, 0, Fault::kNone, &clean_calls_);
    ASSERT_TRUE(run.status.ok()) << run.status;
    clean_ = {};
    ASSERT_EQ(CheckRestoresAsTemplate(run.root, &clean_.hot), "");
    ASSERT_EQ(CheckRestoresAsTemplate(run.cold, &clean_.cold), "");
    ASSERT_TRUE(Debris(run.root).empty()) << absl::StrJoin(Debris(run.root), ", ");
    ASSERT_LT(clean_.hot.size(), static_cast<size_t>(kSteps)) << "the policy removes nothing";
    if (cold) ASSERT_FALSE(clean_.cold.empty()) << "the policy moves nothing";
  }

  void Sweep(bool cold, Fault fault) {
    LearnClean(cold);
    if (HasFatalFailure()) return;
    const uint64_t total = clean_calls_.size();
    ASSERT_GT(total, 30u);
    std::vector<std::string> problems;
    int failed_runs = 0;
    for (uint64_t n = 1; n <= total && problems.size() < 20; ++n) {
      const bool io_only = fault == Fault::kShortTransfer || fault == Fault::kEintr;
      if (io_only && !testing::IsTransferCall(clean_calls_[n - 1])) continue;
      Run run = RetainWithFault(cold, n, fault);
      std::string problem;
      Outcome outcome;
      if (fault == Fault::kCrash && !run.dropped.ok()) {
        problem = absl::StrCat("DropUnsyncedData: ", run.dropped.ToString());
      } else if (io_only && !run.status.ok()) {
        problem = absl::StrCat("not retried: ", run.status.ToString());
      } else if (fault == Fault::kEnospc && !run.status.ok() &&
                 !absl::IsResourceExhausted(run.status) && !absl::IsUnavailable(run.status)) {
        problem = absl::StrCat("ENOSPC reported as ", run.status.ToString());
      } else {
        problem = Check(run, &outcome);
      }
      if (!run.status.ok()) ++failed_runs;
      // Whatever happened, a clean run afterwards converges to the clean
      // run's result and leaves no debris in ROOT.
      const bool converged = run.status.ok() && outcome.hot == clean_.hot &&
                             outcome.cold == clean_.cold && Debris(run.root).empty();
      if (problem.empty() && !converged) {
        RetentionPolicy again = Policy(cold, run.cold);
        again.stale_temp_age = absl::ZeroDuration();
        auto rerun = RunRetention(run.root, again);
        Outcome after;
        if (!rerun.ok()) {
          problem = absl::StrCat("the clean rerun: ", rerun.status().ToString());
        } else if (problem = Check(run, &after); problem.empty()) {
          if (after.hot != clean_.hot) {
            problem = absl::StrCat("after a clean rerun ROOT holds [", absl::StrJoin(after.hot, ","),
                                   "], the clean run leaves [", absl::StrJoin(clean_.hot, ","), "]");
          } else if (after.cold != clean_.cold) {
            problem = absl::StrCat("after a clean rerun the cold tier holds [", absl::StrJoin(after.cold, ","),
                                   "], the clean run leaves [", absl::StrJoin(clean_.cold, ","), "]");
          } else if (!Debris(run.root).empty()) {
            problem = absl::StrCat("debris in ROOT after a clean rerun: ", absl::StrJoin(Debris(run.root), ", "));
          }
        }
      }
      if (!problem.empty()) {
        problems.push_back(absl::StrCat(testing::FaultName(fault), " at call ", n, "/", total, " (",
                                        run.injected.empty() ? "not injected" : run.injected, "): ",
                                        problem));
      }
      testing::RemoveTree(run.root.substr(0, run.root.size() - 5));
    }
    if (fault == Fault::kEio || fault == Fault::kEnospc) {
      EXPECT_GT(failed_runs, 0) << "no injected fault was ever reported";
    }
    EXPECT_TRUE(problems.empty()) << problems.size() << " bad runs (at most 20 shown):\n"
                                  << absl::StrJoin(problems, "\n");
  }

  static ScratchDir* template_dir_;
  static std::map<int64_t, RestoredStep>* template_steps_;
  ScratchDir scratch_{"ckpt-maint-sweep", testing::SweepScratchBase()};
  int runs_ = 0;
  std::vector<std::string> clean_calls_;
  Outcome clean_;
};

ScratchDir* MaintenanceFaultSweepTest::template_dir_ = nullptr;
std::map<int64_t, RestoredStep>* MaintenanceFaultSweepTest::template_steps_ = nullptr;

TEST_F(MaintenanceFaultSweepTest, RetentionDeletingCrashAtEveryCall) { Sweep(false, Fault::kCrash); }
TEST_F(MaintenanceFaultSweepTest, RetentionDeletingEioAtEveryCall) { Sweep(false, Fault::kEio); }
TEST_F(MaintenanceFaultSweepTest, RetentionDeletingEnospcAtEveryCall) { Sweep(false, Fault::kEnospc); }
TEST_F(MaintenanceFaultSweepTest, RetentionToColdTierCrashAtEveryCall) { Sweep(true, Fault::kCrash); }
TEST_F(MaintenanceFaultSweepTest, RetentionToColdTierEioAtEveryCall) { Sweep(true, Fault::kEio); }
TEST_F(MaintenanceFaultSweepTest, RetentionToColdTierEnospcAtEveryCall) { Sweep(true, Fault::kEnospc); }
TEST_F(MaintenanceFaultSweepTest, RetentionToColdTierShortTransfersAreRetried) {
  Sweep(true, Fault::kShortTransfer);
}
TEST_F(MaintenanceFaultSweepTest, RetentionToColdTierEintrIsRetried) { Sweep(true, Fault::kEintr); }

// The export of the newest step (a delta: its chain is read) with a fault at
// every call: the output is absent or complete, and nothing else is left in
// its directory once the run failed without a crash.
TEST_F(MaintenanceFaultSweepTest, SafetensorsExportAtEveryCall) {
  const std::string root = template_dir_->Join("root");
  auto export_with = [&](uint64_t n, Fault fault, const std::string& out_dir,
                         std::vector<std::string>* calls, std::string* injected) -> absl::Status {
    auto fs = std::make_shared<FaultInjectionFileSystem>(PosixFileSystem());
    fs->RecordCalls(calls != nullptr);
    fs->FailAt(n, fault);
    ReaderOptions options;
    options.step = kSteps;
    options.fs = fs;
    auto reader = Reader::Open(root, options);
    absl::Status status = reader.status();
    if (reader.ok()) status = ExportSafetensors(**reader, "", out_dir + "/out.safetensors", {}, fs).status();
    if (calls != nullptr) *calls = fs->recorded_calls();
    if (injected != nullptr) *injected = fs->first_injected_call();
    if (fault == Fault::kCrash) {
      reader = absl::UnknownError("closed");
      absl::Status dropped = fs->DropUnsyncedData();
      if (!dropped.ok()) return absl::InternalError(absl::StrCat("DropUnsyncedData: ", dropped.ToString()));
    }
    return status;
  };
  std::vector<std::string> calls;
  const std::string clean_dir = scratch_.Join("clean-export");
  std::filesystem::create_directory(clean_dir);
  ASSERT_TRUE(export_with(0, Fault::kNone, clean_dir, &calls, nullptr).ok());
  const std::string want = ReadFile(clean_dir + "/out.safetensors");
  ASSERT_GT(want.size(), 100000u);
  std::vector<std::string> problems;
  int i = 0;
  for (Fault fault : {Fault::kCrash, Fault::kEio, Fault::kEnospc, Fault::kShortTransfer, Fault::kEintr}) {
    for (uint64_t n = 1; n <= calls.size() && problems.size() < 20; ++n) {
      const bool retried = fault == Fault::kShortTransfer || fault == Fault::kEintr;
      if (retried && !testing::IsTransferCall(calls[n - 1])) continue;
      const std::string dir = scratch_.Join(absl::StrCat("export", ++i));
      std::filesystem::create_directory(dir);
      std::string injected;
      absl::Status status = export_with(n, fault, dir, nullptr, &injected);
      std::string problem;
      std::error_code ec;
      const bool exists = std::filesystem::exists(dir + "/out.safetensors", ec);
      if (exists && ReadFile(dir + "/out.safetensors") != want) {
        problem = "the output exists but is not the complete export";
      } else if (retried && !status.ok()) {
        problem = absl::StrCat("not retried: ", status.ToString());
      } else if (!retried && fault != Fault::kCrash && status.ok() && !injected.empty() &&
                 !absl::StartsWith(injected, "new I/O queue (io_uring")) {  // falls back to threads
        problem = "the export succeeded although a call it needs failed";
      } else if (fault == Fault::kEnospc && !status.ok() && !absl::IsResourceExhausted(status)) {
        problem = absl::StrCat("ENOSPC reported as ", status.ToString());
      } else if (fault != Fault::kCrash && !status.ok()) {
        size_t entries = std::distance(std::filesystem::directory_iterator(dir), {});
        if (entries != 0) problem = "a failed export left files behind";
      }
      if (fault == Fault::kCrash && status.ok()) problem = "the export succeeded through a crash";
      if (!problem.empty()) {
        problems.push_back(absl::StrCat(testing::FaultName(fault), " at call ", n, "/", calls.size(),
                                        " (", injected, "): ", problem));
      }
      testing::RemoveTree(dir);
    }
  }
  EXPECT_TRUE(problems.empty()) << problems.size() << " bad exports (at most 20 shown):\n"
                                << absl::StrJoin(problems, "\n");
}

}  // namespace
}  // namespace ckpt
