// Orphans -- what dead writers, compactions, copies and removals leave in a
// root -- are reclaimed by the next writer that opens it (`Engine::Open`,
// through `ckpt::ReclaimOrphans`) and by ckpt-retain (`RunRetention`), each
// only what its locks prove dead, each logged with its size.
// (Over 400 lines: every orphan kind under both locks, the killed writer's
// child process and the cold tier share one set of helpers.)
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "ckpt/catalog.h"
#include "ckpt/engine.h"
#include "ckpt/log.h"
#include "ckpt/maintenance.h"
#include "ckpt/root_lock.h"
#include "gtest/gtest.h"
#include "retain/retention.h"
#include "test_util.h"
#include "testing/fault_injection_file_system.h"

namespace ckpt {
namespace {

namespace stdfs = std::filesystem;
using testing::FaultInjectionFileSystem;
using testing::OwnedTensor;
using testing::RandomTensor;
using testing::ScratchDir;
using testing::Views;
using tools::RetentionAction;
using tools::RetentionPolicy;
using tools::RunRetention;

constexpr char kChildRootEnv[] = "CKPT_ORPHAN_TEST_CHILD_ROOT";

std::vector<OwnedTensor> SmallState() {
  return {RandomTensor("a.w", DType::kFloat32, {4096}, 1), RandomTensor("b.w", DType::kBFloat16, {512}, 2)};
}

// 16 MiB in 64 KiB transfers: with a slowed disk, a save that takes seconds.
std::vector<OwnedTensor> LargeState() {
  return {RandomTensor("big.w", DType::kFloat32, {4 << 20}, 3)};
}

// Writes `bytes` bytes into a new file `path` (its directories created).
void WriteFile(const std::string& path, size_t bytes) {
  stdfs::create_directories(stdfs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << std::string(bytes, 'x');
}

// The names in `root` that are not checkpoints, LATEST or lock files.
std::string LeftoversOf(const std::string& root) {
  return absl::StrJoin(testing::Leftovers(root), ", ");
}

// Bytes of every file under `root` except its lock files and LATEST.
uint64_t DiskBytes(const std::string& root) {
  uint64_t total = 0;
  for (const auto& e : stdfs::recursive_directory_iterator(root)) {
    const std::string name = e.path().filename();
    if (!e.is_regular_file() || e.is_symlink()) continue;
    if (e.path().parent_path() == root && (testing::IsRootLockFile(name) || name == "LATEST")) continue;
    total += e.file_size();
  }
  return total;
}

// Captures the library's log lines while it lives, info lines included
// (whatever CKPT_LOG says: the README's test command sets it to warning).
class LogCapture {
 public:
  LogCapture() {
    SetLogThreshold(LogSeverity::kInfo);
    SetLogSink([this](LogSeverity severity, absl::string_view message) {
      std::lock_guard<std::mutex> lock(mu_);
      lines_.push_back(absl::StrCat(severity == LogSeverity::kWarning ? "W " : severity == LogSeverity::kInfo ? "I " : "? ", message));
    });
  }
  ~LogCapture() { SetLogSink(nullptr); }
  // Whether a line holds every one of `parts`.
  bool Has(const std::vector<std::string>& parts) const {
    std::lock_guard<std::mutex> lock(mu_);
    for (const std::string& line : lines_) {
      bool all = true;
      for (const std::string& p : parts) all = all && absl::StrContains(line, p);
      if (all) return true;
    }
    return false;
  }
  std::string All() const {
    std::lock_guard<std::mutex> lock(mu_);
    return absl::StrJoin(lines_, "\n");
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::string> lines_;
};

// A root with checkpoint 1 of `SmallState()`, closed.
void WriteRoot(const std::string& root) {
  auto engine = Engine::Open(root, testing::SmallChunks());
  ASSERT_TRUE(engine.ok()) << engine.status();
  const std::vector<OwnedTensor> state = SmallState();
  ASSERT_TRUE((*engine)->Save(1, Views(state)).ok());
}

// Waits (at most `deadline`) for a directory of `root` named `prefix`...
// (with `need_data`: that holds a non-empty file); its name, "" if none came.
std::string WaitForTemp(const std::string& root, const std::string& prefix, absl::Duration deadline,
                        bool need_data = true) {
  const absl::Time until = absl::Now() + deadline;
  while (absl::Now() < until) {
    std::error_code ec;
    for (const auto& e : stdfs::directory_iterator(root, ec)) {
      if (!absl::StartsWith(e.path().filename().string(), prefix)) continue;
      if (!need_data) return e.path().filename();
      for (const auto& f : stdfs::directory_iterator(e.path(), ec)) {
        if (f.is_regular_file(ec) && f.file_size(ec) > 0) return e.path().filename();
      }
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return "";
}

// ---------------------------------------------------------------------------
// 1. A writer killed with SIGKILL mid-save: the next one reclaims its temp.

// The child of `KillNineMidSaveThenOpenLeavesOnlyCheckpoints`, run as this
// binary (exec'd: no thread of the parent's is copied into it): commits step
// 1, starts a slow save of step 2 and waits to be killed.
// (DISABLED_: not a test of its own; ctest and a plain run leave it out.)
TEST(OrphanReclaimHelper, DISABLED_ChildSavesUntilKilled) {
  const char* root = getenv(kChildRootEnv);
  if (root == nullptr) GTEST_FAIL() << "only run by KillNineMidSaveThenOpenLeavesOnlyCheckpoints";
  auto fs = std::make_shared<FaultInjectionFileSystem>(PosixFileSystem());
  EngineOptions options = testing::SmallChunks();
  options.fs = fs;
  options.io.backend = IoBackend::kThreads;
  auto engine = Engine::Open(root, options);
  if (!engine.ok()) _exit(10);
  const std::vector<OwnedTensor> small = SmallState();
  if (!(*engine)->Save(1, Views(small)).ok()) _exit(11);
  fs->SetIoDelay(absl::Milliseconds(20));  // 256 transfers: about 5 s
  const std::vector<OwnedTensor> large = LargeState();
  auto handle = (*engine)->SaveAsync(2, Views(large));
  if (!handle.ok()) _exit(12);
  absl::SleepFor(absl::Seconds(60));  // killed long before
  _exit(13);
}

TEST(OrphanReclaimTest, KillNineMidSaveThenOpenLeavesOnlyCheckpoints) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  ASSERT_TRUE(stdfs::create_directory(root));
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Only async-signal-safe calls until exec.
    setenv(kChildRootEnv, root.c_str(), 1);
    execl("/proc/self/exe", "/proc/self/exe", "--gtest_filter=OrphanReclaimHelper.DISABLED_ChildSavesUntilKilled",
          "--gtest_also_run_disabled_tests", static_cast<char*>(nullptr));
    _exit(127);
  }
  const std::string temp = WaitForTemp(root, ".tmp-step-00000000000000000002", absl::Seconds(60));
  int status = 0;
  const pid_t early = waitpid(child, &status, WNOHANG);
  ASSERT_EQ(kill(child, SIGKILL), early == 0 ? 0 : -1);
  if (early == 0) ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_FALSE(temp.empty()) << "the child's save of step 2 never appeared (child status " << status << ")";
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "child status " << status;
  ASSERT_TRUE(stdfs::exists(root + "/" + temp));
  const uint64_t orphan_bytes = *TreeBytes(*PosixFileSystem(), root + "/" + temp);
  EXPECT_GT(orphan_bytes, 0u);

  LogCapture log;
  auto engine = Engine::Open(root, testing::SmallChunks());
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_EQ(LeftoversOf(root), "");
  EXPECT_TRUE(log.Has({"removed " + root + "/" + temp, HumanBytes(orphan_bytes),
                       "a save its writer did not finish"}))
      << log.All();
  EXPECT_EQ(*ListSteps(root), std::vector<int64_t>{1});
  testing::ExpectCheckpointEquals(root, 1, SmallState());
  EXPECT_EQ(DiskBytes(root), *TreeBytes(*PosixFileSystem(), root + "/" + StepDirName(1)));
  // And the engine saves step 2 after all.
  const std::vector<OwnedTensor> state = SmallState();
  ASSERT_TRUE((*engine)->Save(2, Views(state)).ok());
}

// ---------------------------------------------------------------------------
// 2, 3. What the writer's sweep takes, with the retention lock free or held.

struct Debris {
  std::string save, trash, compact, copy, other, probe, unknown_dir, unknown_file;
};

// Fabricates one orphan of each kind (a save temp of 1000 bytes, trash of
// 2000 in a subdirectory, a compaction temp of 3000, a copy temp of 4000,
// another temp of 5, a probe of 4096) and two unknown entries.
Debris MakeDebris(const std::string& root) {
  Debris d;
  d.save = root + "/.tmp-step-00000000000000000007-00000000deadbeef";
  d.trash = root + "/.trash-step-00000000000000000003-0123456789abcdef";
  d.compact = root + "/.tmp-compact-step-00000000000000000001-0000000000000001";
  d.copy = root + "/.tmp-copy-step-00000000000000000001-0000000000000002";
  d.other = root + "/.tmp-something-old";
  d.probe = root + "/.ckpt-direct-probe-00000000000000ff";
  d.unknown_dir = root + "/notes";
  d.unknown_file = root + "/.my-own-file";
  WriteFile(d.save + "/a.shard", 1000);
  WriteFile(d.trash + "/sub/b.shard", 2000);
  WriteFile(d.compact + "/c.shard", 3000);
  WriteFile(d.copy + "/d.shard", 4000);
  WriteFile(d.other + "/e", 5);
  WriteFile(d.probe, 4096);
  WriteFile(d.unknown_dir + "/keep.txt", 10);
  WriteFile(d.unknown_file, 10);
  return d;
}

TEST(OrphanReclaimTest, OpenWithTheRetentionLockFreeReclaimsEveryOrphan) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  WriteRoot(root);
  const Debris d = MakeDebris(root);
  // A compaction interrupted between its two renames: step 1 is set aside.
  const std::string aside = root + "/.compact-old-" + StepDirName(1) + "-0123456789abcdef";
  stdfs::rename(root + "/" + StepDirName(1), aside);
  LogCapture log;
  auto engine = Engine::Open(root, testing::SmallChunks());
  ASSERT_TRUE(engine.ok()) << engine.status();
  for (const std::string& gone : {d.save, d.trash, d.compact, d.copy, d.other, d.probe, aside}) {
    EXPECT_FALSE(stdfs::exists(gone)) << gone;
  }
  EXPECT_TRUE(stdfs::exists(d.unknown_dir + "/keep.txt"));
  EXPECT_TRUE(stdfs::exists(d.unknown_file));
  EXPECT_TRUE(log.Has({"removed " + d.save, "(1000 B)", "a save its writer did not finish"})) << log.All();
  EXPECT_TRUE(log.Has({"removed " + d.trash, "(2.0 KiB)", "a removal that did not finish"})) << log.All();
  EXPECT_TRUE(log.Has({"removed " + d.compact, "(2.9 KiB)", "a compaction"})) << log.All();
  EXPECT_TRUE(log.Has({"removed " + d.copy, "(3.9 KiB)", "a copy"})) << log.All();
  EXPECT_TRUE(log.Has({"removed " + d.probe, "(4.0 KiB)"})) << log.All();
  EXPECT_TRUE(log.Has({"putting back", StepDirName(1)})) << log.All();
  // The set-aside checkpoint is back, whole.
  EXPECT_EQ(*ListSteps(root), std::vector<int64_t>{1});
  testing::ExpectCheckpointEquals(root, 1, SmallState());
}

TEST(OrphanReclaimTest, ReclaimOrphansReportsWhatItRemovedWithSizes) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  WriteRoot(root);
  const Debris d = MakeDebris(root);
  ReclaimScope scope;
  scope.save_temps = true;
  scope.job_debris = true;
  scope.probe_min_age = absl::ZeroDuration();
  scope.dry_run = true;
  auto listed = ReclaimOrphans(root, scope);
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(listed->removed, 6u);
  EXPECT_EQ(listed->bytes, 1000u + 2000 + 3000 + 4000 + 5 + 4096);
  EXPECT_TRUE(stdfs::exists(d.save) && stdfs::exists(d.trash) && stdfs::exists(d.probe));  // dry run

  scope.dry_run = false;
  scope.probe_min_age = absl::Hours(1);  // the probe is fresh: it stays
  auto stats = ReclaimOrphans(root, scope);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->removed, 5u);
  EXPECT_EQ(stats->failed, 0u);
  EXPECT_EQ(stats->bytes, 1000u + 2000 + 3000 + 4000 + 5);
  std::vector<std::string> want = {stdfs::path(d.copy).filename(), stdfs::path(d.compact).filename(),
                                   stdfs::path(d.other).filename(), stdfs::path(d.save).filename(),
                                   stdfs::path(d.trash).filename()};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(stats->removed_names(), want);
  EXPECT_TRUE(stdfs::exists(d.probe));
  EXPECT_TRUE(stdfs::exists(d.unknown_dir) && stdfs::exists(d.unknown_file));
  testing::ExpectCheckpointEquals(root, 1, SmallState());
  // A root that cannot be listed is still an error.
  EXPECT_TRUE(absl::IsNotFound(ReclaimOrphans(dir.Join("missing"), scope).status()));
}

TEST(OrphanReclaimTest, OpenWithTheRetentionLockHeldReclaimsOnlySaves) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  WriteRoot(root);
  const Debris d = MakeDebris(root);
  auto retention = LockRoot(root, RootLockKind::kRetention, "a retention job");
  ASSERT_TRUE(retention.ok()) << retention.status();
  LogCapture log;
  auto engine = Engine::Open(root, testing::SmallChunks());
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_FALSE(stdfs::exists(d.save));
  for (const std::string& stays : {d.trash, d.compact, d.copy, d.other, d.probe}) {
    EXPECT_TRUE(stdfs::exists(stays)) << stays;
  }
  EXPECT_TRUE(log.Has({"I ", "a retention job owns them"})) << log.All();
}

// ---------------------------------------------------------------------------
// 4. ckpt-retain: save temps go when no writer is alive, a live writer's stay.

TEST(OrphanReclaimTest, RetentionReclaimsAFreshSaveTempWhenNoWriterIsAlive) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  WriteRoot(root);
  const Debris d = MakeDebris(root);
  RetentionPolicy policy;
  policy.keep_last = 5;
  policy.dry_run = true;
  auto planned = RunRetention(root, policy);
  ASSERT_TRUE(planned.ok()) << planned.status();
  bool listed = false;
  for (const RetentionAction& a : *planned) {
    if (a.kind != RetentionAction::Kind::kRemoveStale) continue;
    EXPECT_FALSE(a.done) << a.name;
    if (a.name == stdfs::path(d.save).filename()) {
      listed = a.kind == RetentionAction::Kind::kRemoveStale && a.bytes == 1000;
    }
  }
  EXPECT_TRUE(listed) << "the dry run does not list the dead writer's save";
  for (const std::string& stays : {d.save, d.trash, d.compact, d.copy, d.other}) {
    EXPECT_TRUE(stdfs::exists(stays)) << "a dry run removed " << stays;
  }

  policy.dry_run = false;
  auto done = RunRetention(root, policy);
  ASSERT_TRUE(done.ok()) << done.status();
  uint64_t bytes = 0;
  for (const RetentionAction& a : *done) {
    EXPECT_TRUE(a.error.empty()) << a.name << ": " << a.error;
    if (a.kind == RetentionAction::Kind::kRemoveStale) {
      EXPECT_TRUE(a.done) << a.name;
      bytes += a.bytes;
    }
  }
  EXPECT_EQ(bytes, 1000u + 2000 + 3000 + 4000 + 5);  // not the fresh probe
  for (const std::string& gone : {d.save, d.trash, d.compact, d.copy, d.other}) {
    EXPECT_FALSE(stdfs::exists(gone)) << gone;
  }
  EXPECT_TRUE(stdfs::exists(d.unknown_dir) && stdfs::exists(d.unknown_file));
  // The writer lock was only borrowed.
  auto engine = Engine::Open(root, testing::SmallChunks());
  EXPECT_TRUE(engine.ok()) << engine.status();
  testing::ExpectCheckpointEquals(root, 1, SmallState());
}

TEST(OrphanReclaimTest, RetentionLeavesALiveWritersSaveInProgress) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  auto fs = std::make_shared<FaultInjectionFileSystem>(PosixFileSystem());
  EngineOptions options = testing::SmallChunks();
  options.fs = fs;
  options.io.backend = IoBackend::kThreads;
  auto engine = Engine::Open(root, options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const std::vector<OwnedTensor> small = SmallState();
  ASSERT_TRUE((*engine)->Save(1, Views(small)).ok());
  fs->HoldIo(true);  // a save in progress, stuck on a slow disk until released
  const std::vector<OwnedTensor> large = LargeState();
  std::shared_ptr<SaveHandle> handle;
  testing::RunOrDie([&] {
    auto h = (*engine)->SaveAsync(2, Views(large));
    ASSERT_TRUE(h.ok()) << h.status();
    handle = *h;
  }, absl::Seconds(60), "SaveAsync of step 2");
  ASSERT_NE(handle, nullptr);
  const std::string temp =
      WaitForTemp(root, ".tmp-step-00000000000000000002", absl::Seconds(30), /*need_data=*/false);
  ASSERT_FALSE(temp.empty());
  const absl::Time until = absl::Now() + absl::Seconds(30);
  while (fs->io_held_waiters() == 0 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_GT(fs->io_held_waiters(), 0u) << "the save of step 2 is not writing";
  RetentionPolicy policy;
  policy.keep_last = 5;
  // (The default --stale-temp-age, 1h: only a writer hung that long loses
  // its save in progress.)
  auto actions = RunRetention(root, policy);
  ASSERT_TRUE(actions.ok()) << actions.status();
  for (const RetentionAction& a : *actions) EXPECT_NE(a.name, temp) << a.reason;
  EXPECT_TRUE(stdfs::exists(root + "/" + temp));
  fs->HoldIo(false);
  ASSERT_TRUE(testing::WaitOrDie(*handle, absl::Seconds(60), "save of step 2").ok());
  EXPECT_EQ(*ListSteps(root), (std::vector<int64_t>{1, 2}));
  testing::ExpectCheckpointEquals(root, 2, large);
}

// ---------------------------------------------------------------------------
// 5. A removal that fails does not fail the open.

// ckpt-retain holds the writer lock only for the renames of a dead writer's
// save temps: a trainer opening at that moment waits for it; another
// engine's lock still fails an open at once.
TEST(OrphanReclaimTest, AnOpenWaitsOutCkptRetainsHoldOfTheWriterLock) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  stdfs::create_directories(root);
  auto held = LockRoot(root, RootLockKind::kWriter, "ckpt-retain");
  ASSERT_TRUE(held.ok()) << held.status();
  std::thread release([&] {
    absl::SleepFor(absl::Milliseconds(300));
    held->reset();
  });
  const absl::Time start = absl::Now();
  auto engine = Engine::Open(root, EngineOptions());
  const absl::Duration waited = absl::Now() - start;
  release.join();
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_GE(waited, absl::Milliseconds(250));
  EXPECT_LT(waited, absl::Seconds(5));
  // A second engine is refused at once, naming the holder.
  const absl::Time again = absl::Now();
  auto second = Engine::Open(root, EngineOptions());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_LT(absl::Now() - again, absl::Seconds(1));
  EXPECT_TRUE(absl::StrContains(second.status().message(), "ckpt engine, pid")) << second.status();
}

TEST(OrphanReclaimTest, AnEioRemovingAnOrphanIsAWarningAndTheOpenSucceeds) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  WriteRoot(root);
  const std::string orphan = root + "/.tmp-step-00000000000000000005-00000000deadbeef";
  auto fs = std::make_shared<FaultInjectionFileSystem>(PosixFileSystem());
  EngineOptions options = testing::SmallChunks();
  options.fs = fs;
  // Find the call that unlinks the orphan's file.
  WriteFile(orphan + "/x.shard", 100);
  fs->RecordCalls(true);
  { ASSERT_TRUE(Engine::Open(root, options).ok()); }
  const std::vector<std::string> calls = fs->recorded_calls();
  uint64_t unlink_call = 0;
  for (size_t i = 0; i < calls.size(); ++i) {
    if (calls[i] == "unlink " + orphan + "/x.shard") unlink_call = i + 1;
  }
  ASSERT_GT(unlink_call, 0u) << absl::StrJoin(calls, "\n");
  ASSERT_FALSE(stdfs::exists(orphan));

  WriteFile(orphan + "/x.shard", 100);
  fs->ResetCallCount();
  fs->FailAt(unlink_call, testing::Fault::kEio);
  LogCapture log;
  auto engine = Engine::Open(root, options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_EQ(fs->injected_count(), 1u) << fs->first_injected_call();
  EXPECT_TRUE(log.Has({"W ", "could not remove " + orphan, "(100 B)"})) << log.All();
  EXPECT_TRUE(stdfs::exists(orphan + "/x.shard"));
  testing::ExpectCheckpointEquals(root, 1, SmallState());
  const std::vector<OwnedTensor> state = SmallState();
  EXPECT_TRUE((*engine)->Save(2, Views(state)).ok());
}

// ---------------------------------------------------------------------------
// 6. The cold tier's orphans.

TEST(OrphanReclaimTest, RetentionReclaimsACopyTempLeftInTheColdTier) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  const std::string cold = dir.Join("cold");
  {
    auto engine = Engine::Open(root, testing::SmallChunks());
    ASSERT_TRUE(engine.ok()) << engine.status();
    const std::vector<OwnedTensor> state = SmallState();
    for (int64_t step = 1; step <= 3; ++step) ASSERT_TRUE((*engine)->Save(step, Views(state)).ok());
  }
  ASSERT_TRUE(stdfs::create_directory(cold));
  const std::string copy = cold + "/.tmp-copy-" + StepDirName(1) + "-00000000000000aa";
  const std::string compact = cold + "/.tmp-compact-" + StepDirName(1) + "-00000000000000bb";
  WriteFile(copy + "/a.shard", 3000);
  WriteFile(compact + "/b.shard", 7);
  RetentionPolicy policy;
  policy.keep_last = 1;
  policy.cold_dir = cold;

  // Another job holds the cold tier: nothing happens.
  {
    auto other = LockRoot(cold, RootLockKind::kRetention, "another root's retention");
    ASSERT_TRUE(other.ok()) << other.status();
    auto refused = RunRetention(root, policy);
    EXPECT_TRUE(absl::IsUnavailable(refused.status())) << refused.status();
    EXPECT_TRUE(absl::StrContains(refused.status().message(), "--cold-dir")) << refused.status();
    EXPECT_TRUE(stdfs::exists(copy));
  }
  auto actions = RunRetention(root, policy);
  ASSERT_TRUE(actions.ok()) << actions.status();
  bool reported = false;
  for (const RetentionAction& a : *actions) {
    EXPECT_TRUE(a.error.empty()) << a.name << ": " << a.error;
    if (a.name == copy) reported = a.done && a.bytes == 3000;
  }
  EXPECT_TRUE(reported);
  EXPECT_FALSE(stdfs::exists(copy));
  EXPECT_FALSE(stdfs::exists(compact));
  EXPECT_EQ(*ListSteps(cold), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(*ListSteps(root), std::vector<int64_t>{3});
  EXPECT_EQ(LeftoversOf(cold), "");
  testing::ExpectCheckpointEquals(cold, 1, SmallState());
}

}  // namespace
}  // namespace ckpt
