// Crash and fault tests of the engine, the reader and the commit protocol,
// driven through `FaultInjectionFileSystem` (LevelDB's fault_injection_test
// and RocksDB's FaultInjectionTestFS in spirit).
//
// The sweeps: a root holds a committed step 1; a second save (step 2) runs
// with one fault armed at call n, for every n the clean save makes, and for
// each fault kind. Afterwards the root is read back with a clean file system:
// - kShortTransfer, kEintr (at transfers): retried, the save succeeds;
// - kEio, kEnospc: the save fails naming a path (ENOSPC as kResourceExhausted)
//   and leaves step 1 alone, with nothing of step 2 behind;
// - kCrash: after dropping what was not durable, the newest checkpoint is
//   exactly step 1 or exactly step 2, never a mix, never an error.
// A reader sweep does the same to a restore. Damaged files (a flipped byte, a
// cut shard) are kDataLoss naming the file. The file system's own behaviour
// (counting, faults, what a simulated power loss keeps) is tested last.
// (About 950 lines, over the house ~400: one sweep harness shared by the
// engine, reader and commit sweeps; splitting it would copy the harness.)
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ckpt/catalog.h"
#include "ckpt/engine.h"
#include "ckpt/file_system.h"
#include "ckpt/reader.h"
#include "gtest/gtest.h"
#include "test_util.h"
#include "testing/fault_injection_file_system.h"

namespace ckpt {
namespace {

using testing::Fault;
using testing::FaultInjectionFileSystem;
using testing::OwnedTensor;
using testing::RandomTensor;
using testing::ScratchDir;

// The sweeps open hundreds of engines: keep their info lines out of the log
// unless CKPT_LOG asks for them.
const bool kQuietLog = (setenv("CKPT_LOG", "warning", /*overwrite=*/0), true);

// ---------------------------------------------------------------------------
// Checkpoint contents and checks.

// The tensors of checkpoint `step` (1 or 2): edge sizes (0, 1, 4095, 4096,
// 4097 bytes) and one of 3 MiB, in three modules, different for each step.
const std::vector<OwnedTensor>& StepTensors(int64_t step) {
  static const auto* tensors = [] {
    auto* m = new std::map<int64_t, std::vector<OwnedTensor>>();
    for (int64_t s : {1, 2}) {
      const uint64_t seed = static_cast<uint64_t>(s) * 1000;
      (*m)[s] = {
          RandomTensor("encoder.empty", DType::kFloat32, {0, 7}, seed + 1),
          RandomTensor("encoder.flag", DType::kBool, {}, seed + 2),
          RandomTensor("encoder.odd", DType::kUInt8, {4095}, seed + 3),
          RandomTensor("encoder.block", DType::kInt32, {1024}, seed + 4),
          RandomTensor("encoder.over", DType::kInt8, {4097}, seed + 5),
          RandomTensor("decoder.big", DType::kFloat32, {768, 1024}, seed + 6),
          RandomTensor("decoder.bias", DType::kBFloat16, {1000}, seed + 7),
          RandomTensor("decoder.scale", DType::kFloat64, {}, seed + 8),
          RandomTensor("head.w", DType::kFloat16, {33, 17}, seed + 9),
          // A name only this step has, so that a mix cannot pass for either.
          RandomTensor(s == 1 ? "head.old" : "head.new", DType::kInt64, {5}, seed + 10),
      };
      // Half of the big tensor compresses, so that zstd records vary in size.
      std::vector<uint8_t>& big = (*m)[s][5].bytes;
      std::fill(big.begin() + big.size() / 2, big.end(), uint8_t{0});
    }
    return m;
  }();
  return tensors->at(step);
}

std::string Extras(int64_t step) { return absl::StrCat(R"({"step": )", step, "}"); }

// How the sweeps write: the I/O backend and the zstd level (0: raw records).
struct SweepConfig {
  IoBackend backend = IoBackend::kAuto;
  int compression_level = 0;
};

void PrintTo(const SweepConfig& config, std::ostream* os) {
  *os << (config.backend == IoBackend::kUring ? "io_uring" : "threads") << ", zstd level "
      << config.compression_level;
}

EngineOptions SaveOptions(std::shared_ptr<FileSystem> fs, SweepConfig config) {
  EngineOptions options;
  options.fs = std::move(fs);
  options.io.backend = config.backend;
  options.compression_level = config.compression_level;
  options.io.chunk_bytes = 64 << 10;  // many transfers: many calls to fail
  options.io.buffer_bytes = 256 << 10;
  options.io.queue_depth = 8;
  options.shard_min_bytes = 4096;  // a shard per module
  options.shard_max_bytes = 1 << 20;  // the 3 MiB tensor alone in its shard
  return options;
}

ReaderOptions CleanReaderOptions(std::optional<int64_t> step) {
  ReaderOptions options;
  options.step = step;
  options.io.buffer_bytes = 1 << 20;
  options.io.chunk_bytes = 256 << 10;
  return options;
}

// "" if `tensors` are exactly those of `step`, bit for bit, in any order;
// otherwise what differs.
std::string DiffTensors(const std::vector<Tensor>& tensors, int64_t step) {
  const std::vector<OwnedTensor>& expected = StepTensors(step);
  if (tensors.size() != expected.size()) {
    return absl::StrCat("holds ", tensors.size(), " tensors, step ", step, " has ",
                        expected.size());
  }
  for (const OwnedTensor& want : expected) {
    auto it = std::find_if(tensors.begin(), tensors.end(),
                           [&](const Tensor& t) { return t.name == want.name; });
    if (it == tensors.end()) return absl::StrCat("tensor ", want.name, " is missing");
    if (it->dtype != want.dtype || it->shape != want.shape ||
        it->nbytes() != want.bytes.size() ||
        (it->nbytes() > 0 && std::memcmp(it->data(), want.bytes.data(), it->nbytes()) != 0)) {
      return absl::StrCat("tensor ", want.name, " differs from step ", step, "'s");
    }
  }
  return "";
}

// "" if `reader` holds exactly the tensors of `step` (and, with `verify`,
// passes `Verify`); otherwise what differs.
std::string CompareToStep(Reader& reader, int64_t step, bool verify = true) {
  if (reader.step() != step) return absl::StrCat("reader is at step ", reader.step());
  if (reader.extras_json().find(absl::StrCat(step)) == std::string::npos) {
    return absl::StrCat("extras ", reader.extras_json(), " are not step ", step, "'s");
  }
  absl::StatusOr<std::vector<Tensor>> all = reader.ReadAll();
  if (!all.ok()) return absl::StrCat("ReadAll: ", all.status().ToString());
  std::string diff = DiffTensors(*all, step);
  if (!diff.empty()) return diff;
  if (!verify) return "";
  absl::Status verified = reader.Verify();
  if (!verified.ok()) return absl::StrCat("Verify: ", verified.ToString());
  return "";
}

// "" if `root` holds checkpoint `step` with exactly its tensors.
std::string CheckStep(const std::string& root, int64_t step, bool verify = true) {
  auto reader = Reader::Open(root, CleanReaderOptions(step));
  if (!reader.ok()) return absl::StrCat("open step ", step, ": ", reader.status().ToString());
  std::string diff = CompareToStep(**reader, step, verify);
  return diff.empty() ? "" : absl::StrCat("step ", step, ": ", diff);
}

// The newest checkpoint of `root` through a clean reader, checked against
// the step it claims to be; or -1 with `error`.
int64_t LatestStep(const std::string& root, bool verify, std::string* error) {
  auto reader = Reader::Open(root, CleanReaderOptions(std::nullopt));
  if (!reader.ok()) {
    *error = absl::StrCat("open latest: ", reader.status().ToString());
    return -1;
  }
  int64_t step = (*reader)->step();
  if (step != 1 && step != 2) {
    *error = absl::StrCat("latest is step ", step);
    return -1;
  }
  std::string diff = CompareToStep(**reader, step, verify);
  if (!diff.empty()) *error = absl::StrCat("latest (step ", step, "): ", diff);
  return diff.empty() ? step : -1;
}

// The entries of `dir` but its lock files, sorted.
std::vector<std::string> SortedEntries(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (!testing::IsRootLockFile(name)) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

// "" if checkpoint `step` of `root` opens and verifies.
std::string VerifyStep(const std::string& root, int64_t step) {
  auto reader = Reader::Open(root, CleanReaderOptions(step));
  if (!reader.ok()) return absl::StrCat("open step ", step, ": ", reader.status().ToString());
  absl::Status verified = (*reader)->Verify();
  return verified.ok() ? "" : absl::StrCat("step ", step, ": ", verified.ToString());
}

// Saves `step` into `root` through the real file system.
absl::Status CleanSave(const std::string& root, int64_t step, SweepConfig config = {}) {
  auto engine = Engine::Open(root, SaveOptions(PosixFileSystem(), config));
  if (!engine.ok()) return engine.status();
  return (*engine)->Save(step, testing::Views(StepTensors(step)), Extras(step)).status();
}

// ---------------------------------------------------------------------------
// The sweeps.

class FaultSweepTest : public ::testing::TestWithParam<SweepConfig> {
 protected:
  // A root holding committed step 1, copied for every run.
  void SetUp() override {
    if (GetParam().backend == IoBackend::kUring) {
      auto uring = PosixFileSystem()->NewIoQueue(IoQueueKind::kUring, 1);
      if (!uring.ok() && uring.status().code() == absl::StatusCode::kUnavailable) {
        CKPT_SKIP_UNLESS_REQUIRED(absl::StrCat("io_uring refused here: ", uring.status().ToString()));
      }
    }
    template_root_ = scratch_.Join("template");
    ASSERT_TRUE(CleanSave(template_root_, 1, GetParam()).ok());
  }

  std::string FreshRoot() {
    std::string root = scratch_.Join(absl::StrCat("root", ++roots_));
    std::filesystem::copy(template_root_, root, std::filesystem::copy_options::recursive);
    return root;
  }

  struct Run {
    std::string root;
    absl::Status status;  // of Engine::Open, then of Save
    std::string injected;  // the call the fault hit, "" if none
    absl::Status dropped;  // of DropUnsyncedData (kCrash)
  };

  // Opens an engine over a fresh root with `fault` armed at call `n`, saves
  // step 2, destroys the engine and, after a crash, drops unsynced data.
  // `calls`, if not null, receives the calls made.
  Run SaveWithFault(uint64_t n, Fault fault, std::vector<std::string>* calls = nullptr) {
    Run run;
    run.root = FreshRoot();
    auto fs = std::make_shared<FaultInjectionFileSystem>(PosixFileSystem());
    fs->RecordCalls(calls != nullptr);
    fs->FailAt(n, fault);
    {
      auto engine = Engine::Open(run.root, SaveOptions(fs, GetParam()));
      run.status = engine.status();
      if (engine.ok()) {
        run.status = (*engine)->Save(2, testing::Views(StepTensors(2)), Extras(2)).status();
      }
    }
    if (calls != nullptr) *calls = fs->recorded_calls();
    run.injected = fs->first_injected_call();
    if (fault == Fault::kCrash) run.dropped = fs->DropUnsyncedData();
    return run;
  }

  // The calls a clean step-2 save (Engine::Open included) makes, in order.
  std::vector<std::string> CleanCalls() {
    std::vector<std::string> calls;
    Run run = SaveWithFault(0, Fault::kNone, &calls);
    EXPECT_TRUE(run.status.ok()) << run.status;
    EXPECT_EQ(CheckStep(run.root, 2), "");
    testing::RemoveTree(run.root);
    return calls;
  }

  // Runs the step-2 save with `fault` at call n, for every n of a clean save
  // (of its transfers only with `io_ops_only`: other calls ignore kShortTransfer
  // and kEintr), and collects what `check(n, total, run)` finds wrong ("" for
  // nothing).
  void Sweep(Fault fault, bool io_ops_only,
             const std::function<std::string(uint64_t, uint64_t, const Run&)>& check) {
    const std::vector<std::string> calls = CleanCalls();
    const uint64_t total = calls.size();
    ASSERT_GT(total, 50u) << "the save makes suspiciously few calls";
    std::vector<std::string> problems;
    for (uint64_t n = 1; n <= total && problems.size() < 20; ++n) {
      if (io_ops_only && !testing::IsTransferCall(calls[n - 1])) continue;
      Run run = SaveWithFault(n, fault);
      std::string problem = check(n, total, run);
      if (!problem.empty()) {
        problems.push_back(absl::StrCat(testing::FaultName(fault), " at call ", n, "/", total,
                                        " (", run.injected.empty() ? "not injected" : run.injected,
                                        "): ", problem));
      }
      testing::RemoveTree(run.root);
    }
    EXPECT_TRUE(problems.empty()) << problems.size() << " bad runs (at most 20 shown):\n"
                                  << absl::StrJoin(problems, "\n");
  }

  // What a save that succeeded must have left.
  static std::string CheckCommitted(const Run& run) {
    std::string diff = CheckStep(run.root, 2, /*verify=*/false);
    if (!diff.empty()) return diff;
    auto old = Reader::Open(run.root, CleanReaderOptions(1));
    if (!old.ok()) return absl::StrCat("step 1: ", old.status().ToString());
    auto hint = ReadLatestHint(run.root);
    if (!hint.ok() || *hint != std::optional<int64_t>(2)) return "LATEST does not name step 2";
    return "";
  }

  // What a save that failed without a crash must have left: step 1 as it
  // was, the newest, and nothing of step 2 (its cleanup ran).
  static std::string CheckRolledBack(const Run& run) {
    std::string error;
    const int64_t latest = LatestStep(run.root, /*verify=*/false, &error);
    if (latest != 1) return error.empty() ? "step 2 is visible" : error;
    auto hint = ReadLatestHint(run.root);
    if (!hint.ok()) return absl::StrCat("LATEST: ", hint.status().ToString());
    if (*hint != std::optional<int64_t>(1)) {
      return absl::StrCat("LATEST names step ", hint->value_or(-1),
                          " but the save failed and step 1 is the newest checkpoint");
    }
    std::vector<std::string> entries = SortedEntries(run.root);
    std::vector<std::string> want = {"LATEST", StepDirName(1)};
    if (entries != want) {
      return absl::StrCat("root holds [", absl::StrJoin(entries, ", "), "], expected [",
                          absl::StrJoin(want, ", "), "]");
    }
    return "";
  }

  // The calls a save may shrug off: removing the O_DIRECT probe file
  // (best-effort cleanup in `Engine::Open`; the probe is left behind), and
  // taking the retention lock for `Engine::Open`'s sweep of dead jobs'
  // orphans (without it, they are left for later).
  static bool Tolerated(const Run& run) {
    return absl::StartsWith(run.injected, absl::StrCat("unlink ", run.root, "/.ckpt-direct-probe-")) ||
           absl::StartsWith(run.injected, absl::StrCat("lock ", run.root, "/.ckpt-retain.lock"));
  }

  std::string CheckFailedCleanly(Fault fault, const Run& run) {
    if (run.injected.empty()) return "the fault never fired";
    if (run.status.ok()) {
      if (!Tolerated(run)) return "the save succeeded although a call it needs failed";
      return CheckStep(run.root, 2, /*verify=*/false);
    }
    if (fault == Fault::kEnospc && run.status.code() != absl::StatusCode::kResourceExhausted) {
      return absl::StrCat("ENOSPC reported as ", run.status.ToString());
    }
    if (!absl::StrContains(run.status.message(), run.root)) {
      return absl::StrCat("the error names no path: ", run.status.ToString());
    }
    return CheckRolledBack(run);
  }

  ScratchDir scratch_{"ckpt-fault-sweep", testing::SweepScratchBase()};
  std::string template_root_;
  int roots_ = 0;
};

TEST_P(FaultSweepTest, CrashAtEveryCallLeavesPreviousOrNew) {
  int saw_old = 0, saw_new = 0;
  Sweep(Fault::kCrash, /*io_ops_only=*/false,
        [&](uint64_t n, uint64_t total, const Run& run) -> std::string {
    if (run.status.ok()) return "the save succeeded although it crashed";
    if (!run.dropped.ok()) return absl::StrCat("DropUnsyncedData: ", run.dropped.ToString());
    std::string error;
    const int64_t latest = LatestStep(run.root, /*verify=*/true, &error);
    if (latest < 0) return error;
    (latest == 1 ? saw_old : saw_new)++;
    auto steps = ListSteps(run.root);
    if (!steps.ok()) return absl::StrCat("ListSteps: ", steps.status().ToString());
    if (std::find(steps->begin(), steps->end(), 1) == steps->end()) return "step 1 is gone";
    for (int64_t step : *steps) {
      if (step == latest) continue;  // checked above
      std::string diff = VerifyStep(run.root, step);
      if (!diff.empty()) return absl::StrCat("ListSteps lists a damaged checkpoint: ", diff);
    }
    // Recovery: with step 2 lost, a clean engine saves it again over what the
    // crash left (sampled, and every crash of the commit's last calls).
    if (latest == 1 && (n % 8 == 0 || n + 10 > total)) {
      absl::Status again = CleanSave(run.root, 2, GetParam());
      if (!again.ok()) return absl::StrCat("saving step 2 after the crash: ", again.ToString());
      return CheckStep(run.root, 2, /*verify=*/false);
    }
    return "";
  });
  // Crashes before the commit point keep step 1; after it, step 2 survives.
  EXPECT_GT(saw_old, 0);
  EXPECT_GT(saw_new, 0);
}

TEST_P(FaultSweepTest, EioAtEveryCallFailsCleanly) {
  Sweep(Fault::kEio, /*io_ops_only=*/false,
        [&](uint64_t, uint64_t, const Run& run) { return CheckFailedCleanly(Fault::kEio, run); });
}

TEST_P(FaultSweepTest, EnospcAtEveryCallIsResourceExhausted) {
  Sweep(Fault::kEnospc, /*io_ops_only=*/false,
        [&](uint64_t, uint64_t, const Run& run) { return CheckFailedCleanly(Fault::kEnospc, run); });
}

TEST_P(FaultSweepTest, ShortTransferAtEveryCallIsRetried) {
  Sweep(Fault::kShortTransfer, /*io_ops_only=*/true,
        [&](uint64_t, uint64_t, const Run& run) -> std::string {
    if (!run.status.ok()) return absl::StrCat("the save failed: ", run.status.ToString());
    return CheckCommitted(run);
  });
}

TEST_P(FaultSweepTest, EintrAtEveryCallIsRetried) {
  Sweep(Fault::kEintr, /*io_ops_only=*/true,
        [&](uint64_t, uint64_t, const Run& run) -> std::string {
    if (!run.status.ok()) return absl::StrCat("the save failed: ", run.status.ToString());
    return CheckCommitted(run);
  });
}

// The same faults under a reader of step 2: retried, or reported naming the
// file; never wrong data.
TEST_P(FaultSweepTest, ReadFaultsAtEveryCallAreRetriedOrReported) {
  const std::string root = FreshRoot();
  ASSERT_TRUE(CleanSave(root, 2, GetParam()).ok());
  auto read = [&](Fault fault, uint64_t n, std::vector<std::string>* calls) -> absl::Status {
    auto fs = std::make_shared<FaultInjectionFileSystem>(PosixFileSystem());
    fs->RecordCalls(calls != nullptr);
    fs->FailAt(n, fault);
    ReaderOptions options = CleanReaderOptions(2);
    options.fs = fs;
    options.io.backend = GetParam().backend;
    options.io.chunk_bytes = 64 << 10;
    auto reader = Reader::Open(root, options);
    if (!reader.ok()) return reader.status();
    auto all = (*reader)->ReadAll();
    if (!all.ok()) return all.status();
    // kUnknown marks wrong data: no file-system error maps to it.
    std::string diff = DiffTensors(*all, 2);
    if (!diff.empty()) return absl::UnknownError(diff);
    absl::Status verified = (*reader)->Verify();
    if (calls != nullptr) *calls = fs->recorded_calls();
    return verified;
  };
  std::vector<std::string> calls;
  ASSERT_TRUE(read(Fault::kNone, 0, &calls).ok());
  const uint64_t total = calls.size();
  ASSERT_GT(total, 50u);
  std::vector<std::string> problems;
  for (Fault fault : {Fault::kShortTransfer, Fault::kEintr, Fault::kEio, Fault::kEnospc}) {
    for (uint64_t n = 1; n <= total && problems.size() < 20; ++n) {
      const bool retried = fault == Fault::kShortTransfer || fault == Fault::kEintr;
      if (retried && !testing::IsTransferCall(calls[n - 1])) continue;
      absl::Status status = read(fault, n, nullptr);
      std::string problem;
      if (retried && !status.ok()) problem = status.ToString();
      if (!retried && status.code() == absl::StatusCode::kUnknown) problem = status.ToString();
      if (!retried && status.ok()) problem = "a read that needed the failed call succeeded";
      if (!retried && !status.ok() && !absl::StrContains(status.message(), root)) {
        problem = absl::StrCat("the error names no path: ", status.ToString());
      }
      if (!problem.empty()) {
        problems.push_back(absl::StrCat(testing::FaultName(fault), " at call ", n, "/", total,
                                        ": ", problem));
      }
    }
  }
  EXPECT_TRUE(problems.empty()) << problems.size() << " bad reads (at most 20 shown):\n"
                                << absl::StrJoin(problems, "\n");
}

// Pinpoints of two failures the sweeps find (one call each).

// The commit's last call is the fsync of ROOT after LATEST was replaced. When
// it fails the save fails and step 2 is removed, so LATEST must not be left
// naming it.
TEST_P(FaultSweepTest, FailedRootSyncAfterLatestRenameLeavesLatestValid) {
  const uint64_t total = CleanCalls().size();
  Run run = SaveWithFault(total, Fault::kEio);
  ASSERT_TRUE(absl::StartsWith(run.injected, absl::StrCat("fsync directory ", run.root, " ")))
      << "the last call is no longer the final root fsync: " << run.injected;
  ASSERT_FALSE(run.status.ok());
  auto hint = ReadLatestHint(run.root);
  ASSERT_TRUE(hint.ok()) << hint.status();
  auto steps = ListSteps(run.root);
  ASSERT_TRUE(steps.ok()) << steps.status();
  ASSERT_TRUE(hint->has_value());
  EXPECT_TRUE(std::find(steps->begin(), steps->end(), **hint) != steps->end())
      << "LATEST names step " << **hint << ", which the failed save removed";
}

// Errors of `Engine::Open` name the root, even where the failing call (the
// I/O queue's creation) has no path of its own.
TEST_P(FaultSweepTest, IoQueueFailureNamesTheRoot) {
  for (uint64_t n = 1; n <= 5; ++n) {
    Run run = SaveWithFault(n, Fault::kEio);
    if (!absl::StartsWith(run.injected, "new I/O queue")) continue;
    ASSERT_FALSE(run.status.ok());
    EXPECT_TRUE(absl::StrContains(run.status.message(), run.root)) << run.status;
    return;
  }
  FAIL() << "Engine::Open made no I/O queue in its first 5 calls";
}

INSTANTIATE_TEST_SUITE_P(Configs, FaultSweepTest,
                         ::testing::Values(SweepConfig{IoBackend::kUring, 0},
                                           SweepConfig{IoBackend::kThreads, 0},
                                           SweepConfig{IoBackend::kThreads, 3}),
                         [](const ::testing::TestParamInfo<SweepConfig>& info) {
                           return absl::StrCat(
                               info.param.backend == IoBackend::kUring ? "Uring" : "Threads",
                               info.param.compression_level > 0 ? "Zstd" : "");
                         });

// ---------------------------------------------------------------------------
// Damaged checkpoints.

class CorruptionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = scratch_.Join("root");
    ASSERT_TRUE(CleanSave(root_, 1).ok());
    ASSERT_TRUE(CleanSave(root_, 2).ok());
    auto reader = Reader::Open(root_, CleanReaderOptions(2));
    ASSERT_TRUE(reader.ok()) << reader.status();
    dir2_ = (*reader)->dir();
    const TensorInfo* big = (*reader)->Find("decoder.big");
    ASSERT_NE(big, nullptr);
    big_ = *big;
  }

  static void FlipByte(const std::string& path, uint64_t offset) {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good()) << path;
    f.seekg(static_cast<std::streamoff>(offset));
    char c = 0;
    f.read(&c, 1);
    ASSERT_TRUE(f.good()) << path << " has no byte " << offset;
    c = static_cast<char>(c ^ 0x20);
    f.seekp(static_cast<std::streamoff>(offset));
    f.write(&c, 1);
    ASSERT_TRUE(f.good());
  }

  static void ExpectDataLoss(const absl::Status& status, const std::string& path,
                             const std::string& tensor = "") {
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
    EXPECT_TRUE(absl::StrContains(status.message(), path)) << status << " should name " << path;
    if (!tensor.empty()) {
      EXPECT_TRUE(absl::StrContains(status.message(), tensor))
          << status << " should name tensor " << tensor;
    }
  }

  ScratchDir scratch_{"ckpt-corruption"};
  std::string root_;
  std::string dir2_;
  TensorInfo big_;
};

TEST_F(CorruptionTest, FlippedShardByteIsDataLossNamingFileAndTensor) {
  const std::string shard = absl::StrCat(dir2_, "/", big_.shard);
  FlipByte(shard, big_.offset + big_.raw_bytes / 2);

  // The manifest is intact: the checkpoint opens, its data does not verify.
  auto reader = Reader::Open(root_, CleanReaderOptions(2));
  ASSERT_TRUE(reader.ok()) << reader.status();
  ExpectDataLoss((*reader)->Verify(), shard, "decoder.big");
  ExpectDataLoss((*reader)->Read("decoder.big").status(), shard, "decoder.big");
  ExpectDataLoss((*reader)->ReadAll().status(), shard, "decoder.big");
  // Other tensors still read.
  auto other = (*reader)->Read("encoder.odd");
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(std::memcmp(other->data(), StepTensors(2)[2].bytes.data(), other->nbytes()), 0);
  // Opening the newest checkpoint checks manifests only: it is still step 2.
  auto latest = Reader::Open(root_, CleanReaderOptions(std::nullopt));
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ((*latest)->step(), 2);
  ExpectDataLoss((*latest)->Verify(), shard, "decoder.big");
}

TEST_F(CorruptionTest, FlippedManifestByteFallsBackToPreviousCheckpoint) {
  const std::string manifest = absl::StrCat(dir2_, "/MANIFEST.json");
  const uint64_t size = std::filesystem::file_size(manifest);
  for (uint64_t offset : {uint64_t{0}, size / 3, size / 2, size - 2, size - 1}) {
    SCOPED_TRACE(absl::StrCat("byte ", offset, " of ", size));
    FlipByte(manifest, offset);
    auto named = Reader::Open(root_, CleanReaderOptions(2));
    ASSERT_FALSE(named.ok()) << "a damaged manifest opened";
    ExpectDataLoss(named.status(), manifest);

    auto latest = Reader::Open(root_, CleanReaderOptions(std::nullopt));
    ASSERT_TRUE(latest.ok()) << latest.status();
    EXPECT_EQ(CompareToStep(**latest, 1), "");

    auto summaries = ListCheckpoints(root_);
    ASSERT_TRUE(summaries.ok()) << summaries.status();
    ASSERT_EQ(summaries->size(), 2u);
    EXPECT_TRUE((*summaries)[0].manifest_status.ok());
    EXPECT_EQ((*summaries)[1].manifest_status.code(), absl::StatusCode::kDataLoss);

    FlipByte(manifest, offset);  // repaired, it reads again
    EXPECT_EQ(CheckStep(root_, 2), "");
  }
}

TEST_F(CorruptionTest, TruncatedShardIsDataLossNamingFile) {
  const std::string shard = absl::StrCat(dir2_, "/", big_.shard);
  const uint64_t size = std::filesystem::file_size(shard);
  // One byte short, then cut inside the record, then with the record gone.
  for (uint64_t cut : {size - 1, big_.offset + big_.raw_bytes / 2, big_.offset}) {
    SCOPED_TRACE(absl::StrCat("truncated to ", cut, " of ", size));
    std::filesystem::resize_file(shard, cut);
    auto reader = Reader::Open(root_, CleanReaderOptions(2));
    if (reader.ok()) {
      // A reader that does not check sizes at open must fail on the data.
      ExpectDataLoss((*reader)->Verify(), shard);
      ExpectDataLoss((*reader)->Read("decoder.big").status(), shard);
    } else {
      ExpectDataLoss(reader.status(), shard);
    }
    auto latest = Reader::Open(root_, CleanReaderOptions(std::nullopt));
    ASSERT_TRUE(latest.ok()) << latest.status();
    if ((*latest)->step() == 2) {
      ExpectDataLoss((*latest)->Verify(), shard);
    } else {
      EXPECT_EQ(CompareToStep(**latest, 1), "");
    }
  }
}

// ---------------------------------------------------------------------------
// The fault-injecting file system itself.

class FaultInjectionFileSystemTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto queue = fs_->NewIoQueue(IoQueueKind::kThreads, 4);
    ASSERT_TRUE(queue.ok()) << queue.status();
    queue_ = std::move(*queue);
  }

  std::string Path(const std::string& name) const { return dir_.Join(name); }

  // Runs one op and returns its completion's result.
  int64_t Transfer(IoOp::Kind kind, File* file, uint64_t offset, void* buf, uint32_t length) {
    IoOp op{kind, file, offset, buf, length, -1, 77};
    EXPECT_TRUE(queue_->Submit({&op, 1}).ok());
    std::vector<IoCompletion> completions;
    EXPECT_TRUE(queue_->Reap(1, &completions).ok());
    EXPECT_EQ(completions.size(), 1u);
    if (completions.empty()) return -1;
    EXPECT_EQ(completions[0].tag, 77u);
    return completions[0].result;
  }

  // Writes `contents` to a new file `name`; syncs it when `sync`.
  void Write(const std::string& name, const std::string& contents, bool sync) {
    OpenOptions options;
    options.write = options.create = true;
    auto file = fs_->Open(Path(name), options);
    ASSERT_TRUE(file.ok()) << file.status();
    auto size = (*file)->Size();
    ASSERT_TRUE(size.ok());
    std::string copy = contents;
    ASSERT_EQ(Transfer(IoOp::Kind::kWrite, file->get(), *size, copy.data(),
                       static_cast<uint32_t>(copy.size())),
              static_cast<int64_t>(copy.size()));
    if (sync) ASSERT_TRUE((*file)->Sync().ok());
    ASSERT_TRUE((*file)->Close().ok());
  }

  std::string Contents(const std::string& name) {
    std::ifstream f(Path(name), std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  }
  bool Exists(const std::string& name) { return std::filesystem::exists(Path(name)); }
  void Arm(Fault fault) { fs_->FailAt(fs_->call_count() + 1, fault); }

  ScratchDir dir_{"ckpt-fault-fs"};
  std::shared_ptr<FaultInjectionFileSystem> fs_ =
      std::make_shared<FaultInjectionFileSystem>(PosixFileSystem());
  std::unique_ptr<IoQueue> queue_;
};

TEST_F(FaultInjectionFileSystemTest, CountsCallsAndIoOpsButNotReaps) {
  EXPECT_EQ(fs_->call_count(), 1u);  // NewIoQueue
  ASSERT_TRUE(fs_->CreateDir(Path("d")).ok());
  OpenOptions options;
  options.write = options.create = true;
  auto file = fs_->Open(Path("d/f"), options);
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(fs_->call_count(), 3u);
  char buf[3][100] = {};
  std::vector<IoOp> ops;
  for (int i = 0; i < 3; ++i) {
    ops.push_back(IoOp{IoOp::Kind::kWrite, file->get(), i * 100u, buf[i], 100, -1,
                       static_cast<uint64_t>(i)});
  }
  ASSERT_TRUE(queue_->Submit(ops).ok());
  std::vector<IoCompletion> completions;
  while (completions.size() < 3) ASSERT_TRUE(queue_->Reap(1, &completions).ok());
  EXPECT_EQ(fs_->call_count(), 6u);
  ASSERT_TRUE((*file)->Sync().ok());
  ASSERT_TRUE((*file)->Size().ok());
  ASSERT_TRUE((*file)->Truncate(10).ok());
  ASSERT_TRUE((*file)->DropCache().ok());
  ASSERT_TRUE((*file)->Close().ok());
  EXPECT_EQ(fs_->call_count(), 11u);
  ASSERT_TRUE(fs_->ListDir(Path("d")).ok());
  ASSERT_TRUE(fs_->Stat(Path("d/f")).ok());
  ASSERT_TRUE(fs_->Rename(Path("d/f"), Path("d/g"), RenameMode::kNoReplace).ok());
  ASSERT_TRUE(fs_->SyncDir(Path("d")).ok());
  ASSERT_TRUE(fs_->RemoveFile(Path("d/g")).ok());
  ASSERT_TRUE(fs_->RemoveDir(Path("d")).ok());
  EXPECT_EQ(fs_->call_count(), 17u);
  EXPECT_EQ(fs_->injected_count(), 0u);
  fs_->ResetCallCount();
  EXPECT_EQ(fs_->call_count(), 0u);
}

TEST_F(FaultInjectionFileSystemTest, EioAndEnospcFailOneCallNamingItsPath) {
  Write("a", "hello", true);
  Arm(Fault::kEio);
  absl::Status s = fs_->Rename(Path("a"), Path("b"), RenameMode::kReplace);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), Path("a"))) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "Input/output error")) << s;
  EXPECT_TRUE(Exists("a"));  // the rename never reached the disk
  EXPECT_EQ(fs_->injected_count(), 1u);
  EXPECT_TRUE(absl::StartsWith(fs_->first_injected_call(), "rename " + Path("a"))) << fs_->first_injected_call();

  Arm(Fault::kEnospc);
  s = fs_->CreateDir(Path("d"));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), Path("d"))) << s;
  EXPECT_FALSE(Exists("d"));
  EXPECT_TRUE(fs_->CreateDir(Path("d")).ok());  // only the one call fails
}

TEST_F(FaultInjectionFileSystemTest, FailedIoOpsCompleteWithErrno) {
  OpenOptions options;
  options.write = options.create = true;
  auto file = fs_->Open(Path("f"), options);
  ASSERT_TRUE(file.ok());
  char buf[100] = {1};
  for (auto [fault, error] : {std::pair{Fault::kEio, EIO}, std::pair{Fault::kEnospc, ENOSPC},
                              std::pair{Fault::kEintr, EINTR}}) {
    Arm(fault);
    EXPECT_EQ(Transfer(IoOp::Kind::kWrite, file->get(), 0, buf, 100), -error);
  }
  auto size = (*file)->Size();
  ASSERT_TRUE(size.ok());
  EXPECT_EQ(*size, 0u);  // nothing was written
  EXPECT_EQ(Transfer(IoOp::Kind::kWrite, file->get(), 0, buf, 100), 100);
}

TEST_F(FaultInjectionFileSystemTest, ShortTransferMovesPartOfTheBytes) {
  OpenOptions options;
  options.write = options.create = true;
  auto file = fs_->Open(Path("f"), options);
  ASSERT_TRUE(file.ok());
  std::vector<char> buf(10000, 'x');
  Arm(Fault::kShortTransfer);
  int64_t n = Transfer(IoOp::Kind::kWrite, file->get(), 0, buf.data(), 10000);
  EXPECT_GT(n, 0);
  EXPECT_LT(n, 10000);
  EXPECT_EQ(std::filesystem::file_size(Path("f")), static_cast<uint64_t>(n));
  Arm(Fault::kShortTransfer);  // one byte cannot be cut: EINTR instead
  EXPECT_EQ(Transfer(IoOp::Kind::kWrite, file->get(), 0, buf.data(), 1), -EINTR);

  options.direct = true;
  auto direct = fs_->Open(Path("direct"), options);
  if (!direct.ok() && direct.status().code() == absl::StatusCode::kInvalidArgument) {
    GTEST_SKIP() << "no O_DIRECT here: " << direct.status();
  }
  ASSERT_TRUE(direct.ok()) << direct.status();
  auto block = AlignedBytes::Allocate(3 * kDirectIoAlignment, true);
  ASSERT_TRUE(block.ok());
  Arm(Fault::kShortTransfer);
  n = Transfer(IoOp::Kind::kWrite, direct->get(), 0, block->data(), 3 * kDirectIoAlignment);
  EXPECT_GT(n, 0);
  EXPECT_LT(n, static_cast<int64_t>(3 * kDirectIoAlignment));
  EXPECT_EQ(n % kDirectIoAlignment, 0u);
  Arm(Fault::kShortTransfer);  // one block cannot be cut
  EXPECT_EQ(Transfer(IoOp::Kind::kWrite, direct->get(), 0, block->data(), kDirectIoAlignment),
            -EINTR);
}

TEST_F(FaultInjectionFileSystemTest, ShortTransferAndEintrLeaveOtherCallsAlone) {
  for (Fault fault : {Fault::kShortTransfer, Fault::kEintr}) {
    Arm(fault);
    EXPECT_TRUE(fs_->CreateDir(Path(std::string(testing::FaultName(fault)))).ok());
  }
  EXPECT_EQ(fs_->injected_count(), 0u);
}

TEST_F(FaultInjectionFileSystemTest, CrashFailsThatCallAndEveryLaterOne) {
  OpenOptions options;
  options.write = options.create = true;
  auto file = fs_->Open(Path("f"), options);
  ASSERT_TRUE(file.ok());
  Arm(Fault::kCrash);
  absl::Status s = fs_->SyncDir(dir_.path());
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "simulated crash")) << s;
  EXPECT_TRUE(fs_->crashed());
  EXPECT_EQ(fs_->CreateDir(Path("d")).code(), absl::StatusCode::kAborted);
  EXPECT_FALSE(Exists("d"));
  EXPECT_EQ(fs_->Stat(Path("f")).status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ((*file)->Sync().code(), absl::StatusCode::kAborted);
  char buf[10] = {};
  EXPECT_EQ(Transfer(IoOp::Kind::kWrite, file->get(), 0, buf, 10), -EIO);
  EXPECT_EQ((*file)->Close().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(fs_->injected_count(), 6u);
  fs_->ClearFaults();
  EXPECT_FALSE(fs_->crashed());
  EXPECT_TRUE(fs_->CreateDir(Path("d")).ok());
}

TEST_F(FaultInjectionFileSystemTest, IoDelaySlowsEveryOp) {
  OpenOptions options;
  options.write = options.create = true;
  auto file = fs_->Open(Path("f"), options);
  ASSERT_TRUE(file.ok());
  fs_->SetIoDelay(absl::Milliseconds(30));
  char buf[10] = {};
  const absl::Time start = absl::Now();
  EXPECT_EQ(Transfer(IoOp::Kind::kWrite, file->get(), 0, buf, 10), 10);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(30));
}

TEST_F(FaultInjectionFileSystemTest, DropRemovesEntriesOfUnsyncedDirectories) {
  Write("unsynced", "data", /*sync=*/true);
  ASSERT_TRUE(fs_->CreateDir(Path("dir")).ok());
  ASSERT_TRUE(fs_->DropUnsyncedData().ok());
  EXPECT_FALSE(Exists("unsynced"));  // its data was synced, its name was not
  EXPECT_FALSE(Exists("dir"));
}

TEST_F(FaultInjectionFileSystemTest, DropTruncatesFilesToTheirSyncedSize) {
  Write("synced", "0123456789", /*sync=*/true);
  Write("synced", "tail", /*sync=*/false);  // appended, never synced
  Write("never", "abc", /*sync=*/false);
  ASSERT_TRUE(fs_->SyncDir(dir_.path()).ok());
  ASSERT_TRUE(fs_->DropUnsyncedData().ok());
  EXPECT_EQ(Contents("synced"), "0123456789");
  EXPECT_TRUE(Exists("never"));
  EXPECT_EQ(Contents("never"), "");
}

TEST_F(FaultInjectionFileSystemTest, DropUndoesUnsyncedRenameOfDirectoryWithItsFiles) {
  ASSERT_TRUE(fs_->CreateDir(Path("tmp")).ok());
  Write("tmp/shard", "payload", /*sync=*/true);
  ASSERT_TRUE(fs_->SyncDir(Path("tmp")).ok());
  ASSERT_TRUE(fs_->SyncDir(dir_.path()).ok());
  ASSERT_TRUE(fs_->Rename(Path("tmp"), Path("final"), RenameMode::kNoReplace).ok());
  Write("final/late", "x", /*sync=*/true);  // created after the rename, never listed durably
  ASSERT_TRUE(fs_->DropUnsyncedData().ok());
  EXPECT_FALSE(Exists("final"));
  EXPECT_EQ(Contents("tmp/shard"), "payload");
  EXPECT_FALSE(Exists("tmp/late"));
}

TEST_F(FaultInjectionFileSystemTest, SyncedRenameOfDirectoryKeepsFilesThatFollowedIt) {
  ASSERT_TRUE(fs_->CreateDir(Path("tmp")).ok());
  ASSERT_TRUE(fs_->SyncDir(dir_.path()).ok());
  Write("tmp/a", "synced file, unsynced name", /*sync=*/true);
  Write("tmp/b", "0123", /*sync=*/true);
  Write("tmp/b", "more", /*sync=*/false);
  ASSERT_TRUE(fs_->Rename(Path("tmp"), Path("final"), RenameMode::kNoReplace).ok());
  ASSERT_TRUE(fs_->SyncDir(dir_.path()).ok());
  // "a" and "b" were created in "tmp"; syncing it under its new name makes
  // them durable.
  ASSERT_TRUE(fs_->SyncDir(Path("final")).ok());
  ASSERT_TRUE(fs_->DropUnsyncedData().ok());
  EXPECT_FALSE(Exists("tmp"));
  EXPECT_EQ(Contents("final/a"), "synced file, unsynced name");
  EXPECT_EQ(Contents("final/b"), "0123");  // truncated under its new path
}

TEST_F(FaultInjectionFileSystemTest, DropRemovesFilesWhoseDirectoryWasNeverSynced) {
  ASSERT_TRUE(fs_->CreateDir(Path("tmp")).ok());
  ASSERT_TRUE(fs_->SyncDir(dir_.path()).ok());
  Write("tmp/a", "data", /*sync=*/true);
  ASSERT_TRUE(fs_->Rename(Path("tmp"), Path("final"), RenameMode::kNoReplace).ok());
  ASSERT_TRUE(fs_->SyncDir(dir_.path()).ok());
  ASSERT_TRUE(fs_->DropUnsyncedData().ok());
  EXPECT_TRUE(Exists("final"));
  EXPECT_FALSE(Exists("final/a"));
}

TEST_F(FaultInjectionFileSystemTest, DropRestoresTheFileAnUnsyncedRenameReplaced) {
  {
    std::ofstream latest(Path("LATEST"), std::ios::binary);
    latest << "old\n";
  }
  Write(".LATEST.tmp", "new\n", /*sync=*/true);
  ASSERT_TRUE(fs_->Rename(Path(".LATEST.tmp"), Path("LATEST"), RenameMode::kReplace).ok());
  EXPECT_EQ(Contents("LATEST"), "new\n");
  ASSERT_TRUE(fs_->DropUnsyncedData().ok());
  EXPECT_EQ(Contents("LATEST"), "old\n");
  EXPECT_FALSE(Exists(".LATEST.tmp"));

  Write(".LATEST.tmp", "new\n", /*sync=*/true);
  ASSERT_TRUE(fs_->Rename(Path(".LATEST.tmp"), Path("LATEST"), RenameMode::kReplace).ok());
  ASSERT_TRUE(fs_->SyncDir(dir_.path()).ok());
  ASSERT_TRUE(fs_->DropUnsyncedData().ok());
  EXPECT_EQ(Contents("LATEST"), "new\n");
  EXPECT_FALSE(Exists(".LATEST.tmp"));
}

TEST_F(FaultInjectionFileSystemTest, DropUndoesAnUnsyncedExchangeAndKeepsASyncedOne) {
  ASSERT_TRUE(fs_->CreateDir(Path("old")).ok());
  Write("old/f", "old data", /*sync=*/true);
  ASSERT_TRUE(fs_->SyncDir(Path("old")).ok());
  ASSERT_TRUE(fs_->SyncDir(dir_.path()).ok());
  ASSERT_TRUE(fs_->CreateDir(Path("new")).ok());
  Write("new/f", "new data", /*sync=*/true);
  ASSERT_TRUE(fs_->SyncDir(Path("new")).ok());
  ASSERT_TRUE(fs_->Exchange(Path("new"), Path("old")).ok());
  EXPECT_EQ(Contents("old/f"), "new data");
  // Neither the exchange nor the creation of "new" reached the disk.
  ASSERT_TRUE(fs_->DropUnsyncedData().ok());
  EXPECT_EQ(Contents("old/f"), "old data");
  EXPECT_FALSE(Exists("new"));

  ASSERT_TRUE(fs_->CreateDir(Path("new")).ok());
  Write("new/f", "new data", /*sync=*/true);
  ASSERT_TRUE(fs_->SyncDir(Path("new")).ok());
  ASSERT_TRUE(fs_->Exchange(Path("new"), Path("old")).ok());
  ASSERT_TRUE(fs_->SyncDir(dir_.path()).ok());
  Write("old/late", "x", /*sync=*/true);  // created after, its directory never synced
  ASSERT_TRUE(fs_->DropUnsyncedData().ok());
  EXPECT_EQ(Contents("old/f"), "new data");
  EXPECT_EQ(Contents("new/f"), "old data");
  EXPECT_FALSE(Exists("old/late"));

  fs_->SetExchangeSupported(false);
  absl::Status refused = fs_->Exchange(Path("new"), Path("old"));
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnimplemented) << refused;
  EXPECT_EQ(Contents("old/f"), "new data");
}

TEST_F(FaultInjectionFileSystemTest, RemovalIsDurableAtOnce) {
  Write("f", "data", /*sync=*/true);
  ASSERT_TRUE(fs_->SyncDir(dir_.path()).ok());
  ASSERT_TRUE(fs_->RemoveFile(Path("f")).ok());
  Write("g", "unsynced", /*sync=*/true);
  ASSERT_TRUE(fs_->RemoveFile(Path("g")).ok());
  Write("g", "again", /*sync=*/true);  // a new file under a removed name
  ASSERT_TRUE(fs_->SyncDir(dir_.path()).ok());
  ASSERT_TRUE(fs_->DropUnsyncedData().ok());
  EXPECT_FALSE(Exists("f"));
  EXPECT_EQ(Contents("g"), "again");
}

}  // namespace
}  // namespace ckpt
