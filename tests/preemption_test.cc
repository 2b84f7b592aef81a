// ckpt/preemption.h: a watched signal lets saves in flight and a final save
// commit; at the deadline what is not durable is abandoned cleanly and the
// process ends as the signal would have ended it; a second signal ends it
// at once; the handler is safe whatever thread it interrupts.
//
// A preemption is permanent for a process, so every case that delivers a
// signal runs in a child: this binary again, running `PreemptionChild.DISABLED_Run`
// with the scenario named in $CKPT_PREEMPTION_CHILD. The parent sends the
// signals, as a scheduler would, and checks the root afterwards.
// (Over 400 lines: each case's parent side and its child's scenario live
// together, so that what the parent checks reads next to what the child did.)
#include "ckpt/preemption.h"

#include <dirent.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "ckpt/catalog.h"
#include "ckpt/engine.h"
#include "gtest/gtest.h"
#include "distributed_ranks.h"
#include "test_util.h"
#include "testing/fault_injection_file_system.h"

extern char** environ;

namespace ckpt {
namespace {

using testing::FaultInjectionFileSystem;
using testing::Leftovers;
using testing::OwnedTensor;
using testing::RandomTensor;
using testing::ScratchDir;
using testing::Views;

constexpr absl::Duration kDeadline = absl::Seconds(60);
constexpr char kScenarioEnv[] = "CKPT_PREEMPTION_CHILD";
constexpr char kDirEnv[] = "CKPT_PREEMPTION_DIR";

// The state of step `step`: a few MB, so that a slowed disk keeps a save in
// flight for seconds.
std::vector<OwnedTensor> State(int64_t step, int layers = 6) {
  std::vector<OwnedTensor> state;
  for (int l = 0; l < layers; ++l) {
    state.push_back(RandomTensor(absl::StrCat("layers.", l, ".weight"), DType::kFloat32, {512, 512},
                                 static_cast<uint64_t>(step) * 100 + l));
  }
  return state;
}

bool Exists(const std::string& path) { return std::filesystem::exists(path); }

void Touch(const std::string& path, const std::string& text = "") { testing::WriteText(path, text); }

// --- The parent's side ------------------------------------------------

// Starts this binary as a child running `scenario` in `dir`.
pid_t SpawnChild(const std::string& scenario, const std::string& dir) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
  env.push_back(absl::StrCat(kScenarioEnv, "=", scenario));
  env.push_back(absl::StrCat(kDirEnv, "=", dir));
  std::vector<char*> envp;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string self = "/proc/self/exe";
  std::string filter = "--gtest_filter=PreemptionChild.DISABLED_Run";
  std::string disabled = "--gtest_also_run_disabled_tests";
  std::string brief = "--gtest_brief=1";
  char* argv[] = {self.data(), filter.data(), disabled.data(), brief.data(), nullptr};
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, self.c_str(), nullptr, nullptr, argv, envp.data());
  EXPECT_EQ(rc, 0) << "posix_spawn: " << rc;
  return rc == 0 ? pid : -1;
}

// Waits for `path` to exist, or for the child to end; false on either's
// deadline or if the child ended first.
bool AwaitFile(pid_t pid, const std::string& path, absl::Duration timeout = kDeadline) {
  const absl::Time until = absl::Now() + timeout;
  while (absl::Now() < until) {
    if (Exists(path)) return true;
    int status;
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      ADD_FAILURE() << "child ended (status " << status << ") before " << path << " appeared";
      return false;
    }
    absl::SleepFor(absl::Milliseconds(2));
  }
  ADD_FAILURE() << path << " did not appear within " << timeout;
  return false;
}

// The child's wait status; kills it (and fails) if it is not done in time.
int AwaitExit(pid_t pid, absl::Duration timeout = kDeadline) {
  const absl::Time until = absl::Now() + timeout;
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) != pid) {
    if (absl::Now() >= until) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      ADD_FAILURE() << "child did not end within " << timeout << "; killed";
      return -1;
    }
    absl::SleepFor(absl::Milliseconds(2));
  }
  return status;
}

// Runs `scenario` in a child in `dir`, sends it SIGTERM once its save is in
// flight (DIR/in-flight), and returns its wait status (-1 if it did not get
// that far) and, in `signalled`, when the signal was sent.
int SignalledChild(const std::string& scenario, const ScratchDir& dir,
                   absl::Time* signalled = nullptr) {
  const pid_t pid = SpawnChild(scenario, dir.path());
  if (pid <= 0 || !AwaitFile(pid, dir.Join("in-flight"))) return -1;
  if (signalled != nullptr) *signalled = absl::Now();
  EXPECT_EQ(::kill(pid, SIGTERM), 0);
  return AwaitExit(pid);
}

std::vector<int64_t> Steps(const std::string& root) {
  std::vector<int64_t> steps;
  auto listed = ListCheckpoints(root);
  EXPECT_TRUE(listed.ok()) << listed.status();
  if (listed.ok()) {
    for (const CheckpointSummary& c : *listed) steps.push_back(c.step);
  }
  return steps;
}

std::string Latest(const std::string& root) {
  std::string latest = testing::ReadText(root + "/LATEST");
  while (!latest.empty() && (latest.back() == '\n' || latest.back() == ' ')) latest.pop_back();
  return latest;
}

std::string StepName(int64_t step) {
  std::string digits = std::to_string(step);
  return "step-" + std::string(20 - digits.size(), '0') + digits;
}

// --- In-process cases: no signal is delivered --------------------------

TEST(PreemptionWatchTest, RefusesSignalsItCannotWatchAndAGraceThatIsNotPositive) {
  for (int sig : {0, -1, 65, SIGKILL, SIGSTOP, SIGSEGV, SIGABRT}) {
    PreemptionOptions options;
    options.signals = {sig};
    auto watch = PreemptionWatch::Install(options);
    EXPECT_EQ(watch.status().code(), absl::StatusCode::kInvalidArgument) << sig;
  }
  PreemptionOptions none;
  none.signals.clear();
  EXPECT_EQ(PreemptionWatch::Install(none).status().code(), absl::StatusCode::kInvalidArgument);
  for (absl::Duration grace : {absl::ZeroDuration(), absl::Seconds(-1), absl::InfiniteDuration()}) {
    PreemptionOptions options;
    options.grace = grace;
    EXPECT_EQ(PreemptionWatch::Install(options).status().code(), absl::StatusCode::kInvalidArgument)
        << grace;
  }
}

void CountingHandler(int) {}

TEST(PreemptionWatchTest, OneAtATimeAndUninstallPutsTheEarlierHandlerBack) {
  struct sigaction earlier = {};
  earlier.sa_handler = CountingHandler;
  sigemptyset(&earlier.sa_mask);
  struct sigaction saved;
  ASSERT_EQ(::sigaction(SIGUSR2, &earlier, &saved), 0);
  {
    PreemptionOptions options;
    options.signals = {SIGUSR2, SIGUSR2};  // listed twice: once
    auto watch = PreemptionWatch::Install(options);
    ASSERT_TRUE(watch.ok()) << watch.status();
    EXPECT_FALSE((*watch)->preempted());
    EXPECT_EQ((*watch)->signal(), 0);
    EXPECT_EQ((*watch)->deadline(), absl::InfiniteFuture());
    EXPECT_EQ((*watch)->remaining(), absl::InfiniteDuration());
    EXPECT_FALSE((*watch)->WaitFor(absl::Milliseconds(20)));
    struct sigaction now;
    ASSERT_EQ(::sigaction(SIGUSR2, nullptr, &now), 0);
    EXPECT_NE(now.sa_handler, CountingHandler);  // ours is in place
    EXPECT_EQ(PreemptionWatch::Install(options).status().code(),
              absl::StatusCode::kFailedPrecondition);
  }
  struct sigaction after;
  ASSERT_EQ(::sigaction(SIGUSR2, nullptr, &after), 0);
  EXPECT_EQ(after.sa_handler, CountingHandler);
  // And a new watch may be installed.
  PreemptionOptions options;
  options.signals = {SIGUSR2};
  EXPECT_TRUE(PreemptionWatch::Install(options).ok());
  ASSERT_EQ(::sigaction(SIGUSR2, &saved, nullptr), 0);
}

// --- Cases run in a child ----------------------------------------------

// SIGTERM with a save in flight: it and a final save commit, and the
// process exits by itself.
TEST(PreemptionTest, SigtermLetsTheSaveInFlightAndAFinalSaveCommit) {
  ScratchDir dir;
  const int status = SignalledChild("drain", dir);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  const std::string root = dir.Join("root");
  EXPECT_EQ(Steps(root), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(Latest(root), StepName(3));
  EXPECT_TRUE(Leftovers(root).empty()) << Leftovers(root)[0];
  testing::ExpectCheckpointEquals(root, 2, State(2));
  testing::ExpectCheckpointEquals(root, 3, State(3));
  // The child saw the save of step 2 still in flight when it learnt of the
  // signal (the disk is slowed to seconds per save).
  EXPECT_EQ(testing::ReadText(dir.Join("outcome")), "step 2 in flight at the signal");
}

// A save not durable by the deadline is abandoned: its waiter learns it,
// nothing of it stays, and the process ends killed by SIGTERM.
TEST(PreemptionTest, AtTheDeadlineSavesInFlightAreAbandonedAndTheProcessEnds) {
  ScratchDir dir;
  absl::Time signalled;
  const int status = SignalledChild("deadline", dir, &signalled);
  const absl::Duration took = absl::Now() - signalled;
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) << "status " << status;
  // grace 1 s; cleanup allowance 3 s; scheduling slack.
  EXPECT_GE(took, absl::Milliseconds(900));
  EXPECT_LT(took, absl::Seconds(8));
  const std::string root = dir.Join("root");
  EXPECT_EQ(Steps(root), (std::vector<int64_t>{1}));
  EXPECT_EQ(Latest(root), StepName(1));
  EXPECT_TRUE(Leftovers(root).empty()) << Leftovers(root)[0];
  testing::ExpectCheckpointEquals(root, 1, State(1));
}

// With end_process_at_deadline off, the process goes on; its saves stay
// refused.
TEST(PreemptionTest, WithoutEndingTheProcessSavesAreAbandonedAndRefused) {
  ScratchDir dir;
  const int status = SignalledChild("deadline_keep_running", dir);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  // (What the waiter of the abandoned save and a later SaveAsync got.)
  const std::string outcome = testing::ReadText(dir.Join("outcome"));
  EXPECT_NE(outcome.find("DEADLINE_EXCEEDED"), std::string::npos) << outcome;
  EXPECT_NE(outcome.find("preemption grace after SIGTERM ran out"), std::string::npos) << outcome;
  EXPECT_NE(outcome.find("refused"), std::string::npos) << outcome;
  const std::string root = dir.Join("root");
  EXPECT_EQ(Steps(root), (std::vector<int64_t>{1}));
  EXPECT_TRUE(Leftovers(root).empty()) << Leftovers(root)[0];
  testing::ExpectCheckpointEquals(root, 1, State(1));
}

// Two ranks, one too slow for the grace: at the deadline rank 1 abandons its
// part and rank 0 stops waiting for it, so both saves fail with
// DEADLINE_EXCEEDED naming the preemption, nothing of the step stays, and
// the previous checkpoint is still the latest for both ranks.
TEST(PreemptionTest, ARankTooSlowForTheGraceFailsTheSaveOnEveryRank) {
  ScratchDir dir;
  const int status = SignalledChild("slow_rank", dir);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  const std::string outcome = testing::ReadText(dir.Join("outcome"));
  // What each rank's waiter got, then its SaveAsync after the deadline.
  const std::vector<std::string> lines = absl::StrSplit(outcome, '\n');
  ASSERT_EQ(lines.size(), 4u) << outcome;
  for (const std::string& line : lines) {
    EXPECT_TRUE(absl::StartsWith(line, "DEADLINE_EXCEEDED")) << outcome;
    EXPECT_NE(line.find("preemption grace after SIGTERM ran out"), std::string::npos) << outcome;
  }
  EXPECT_NE(lines[0].find("rank 0 gave up step 2 while it waited for the other ranks"), std::string::npos)
      << outcome;
  EXPECT_NE(lines[1].find("abandoned: not durable"), std::string::npos) << outcome;
  const std::string root = dir.Join("root");
  EXPECT_EQ(Steps(root), (std::vector<int64_t>{1}));
  EXPECT_EQ(Latest(root), StepName(1));
  EXPECT_TRUE(Leftovers(root).empty()) << Leftovers(root)[0];
  for (int r = 0; r < 2; ++r) {
    testing::ExpectRankPart(root, 1, r, 2, testing::RankState(r, 1));
  }
}

// A second SIGTERM (or a SIGKILL) during the drain ends the process at once;
// the previous checkpoint stays the latest, and the next writer removes what
// the unfinished save left.
class SecondSignalTest : public ::testing::TestWithParam<int> {};

TEST_P(SecondSignalTest, EndsTheProcessAtOnceAndLeavesThePreviousCheckpoint) {
  ScratchDir dir;
  const pid_t pid = SpawnChild("drain_slowly", dir.path());
  ASSERT_GT(pid, 0);
  ASSERT_TRUE(AwaitFile(pid, dir.Join("in-flight")));
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  ASSERT_TRUE(AwaitFile(pid, dir.Join("draining")));
  const absl::Time second = absl::Now();
  ASSERT_EQ(::kill(pid, GetParam()), 0);
  const int status = AwaitExit(pid);
  EXPECT_LT(absl::Now() - second, absl::Seconds(3));
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == GetParam()) << "status " << status;
  const std::string root = dir.Join("root");
  // The second signal landed during the drain: the save of step 2 had
  // written data (the child waited for that) and had not committed; its
  // temp directory is still there, for the next writer to reclaim.
  EXPECT_NE(testing::AwaitWrittenTempDir(root, 2, absl::ZeroDuration()), "")
      << "no written temp directory of step 2: the process did not end mid-drain";
  EXPECT_EQ(Steps(root), (std::vector<int64_t>{1}));
  EXPECT_EQ(Latest(root), StepName(1));
  testing::ExpectCheckpointEquals(root, 1, State(1));
  auto engine = Engine::Open(root, EngineOptions());
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_TRUE(Leftovers(root).empty()) << Leftovers(root)[0];
  ASSERT_TRUE((*engine)->Save(2, Views(State(2))).ok());
  ASSERT_TRUE((*engine)->Close().ok());
  testing::ExpectCheckpointEquals(root, 2, State(2));
}

INSTANTIATE_TEST_SUITE_P(Signals, SecondSignalTest, ::testing::Values(SIGTERM, SIGKILL),
                         [](const auto& info) { return info.param == SIGTERM ? "Sigterm" : "Sigkill"; });

// Thousands of watched signals land on every thread of the process (the
// engine's threads among them, holding their locks) while saves run: a
// handler that allocated or locked would deadlock here (the parent's
// deadline catches it) or be reported by ThreadSanitizer.
TEST(PreemptionTest, TheHandlerIsSafeOnEveryThreadWhileSavesRun) {
  ScratchDir dir;
  const pid_t pid = SpawnChild("storm", dir.path());
  ASSERT_GT(pid, 0);
  const int status = AwaitExit(pid, absl::Seconds(120));
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  EXPECT_TRUE(Exists(dir.Join("storm-done")));
}

// --- The child's side --------------------------------------------------

std::atomic<int> storm_earlier_calls{0};
void StormEarlierHandler(int) { storm_earlier_calls.fetch_add(1, std::memory_order_relaxed); }

struct Child {
  std::string dir = std::getenv(kDirEnv) != nullptr ? std::getenv(kDirEnv) : "";
  std::string root() const { return dir + "/root"; }
  std::shared_ptr<FaultInjectionFileSystem> fs =
      std::make_shared<FaultInjectionFileSystem>(PosixFileSystem());
  std::unique_ptr<Engine> engine;

  void Open() {
    EngineOptions options = testing::SmallChunks();
    options.fs = fs;
    auto opened = Engine::Open(root(), options);
    ASSERT_TRUE(opened.ok()) << opened.status();
    engine = std::move(*opened);
    ASSERT_TRUE(engine->Save(1, Views(State(1))).ok());
  }
};

// Until `watch` is preempted (the parent's SIGTERM), doing "training".
void TrainUntilPreempted(const PreemptionWatch& watch) {
  const absl::Time until = absl::Now() + kDeadline;
  while (!watch.preempted()) {
    ASSERT_LT(absl::Now(), until) << "no signal came";
    absl::SleepFor(absl::Milliseconds(1));
  }
}

void DrainScenario() {
  Child c;
  ASSERT_NO_FATAL_FAILURE(c.Open());
  PreemptionOptions options;
  options.grace = absl::Seconds(30);
  auto watch = PreemptionWatch::Install(options);
  ASSERT_TRUE(watch.ok()) << watch.status();
  c.fs->SetIoDelay(absl::Milliseconds(40));  // ~3 s for a save of 6 MB in 64 KiB pieces
  const std::vector<OwnedTensor> two = State(2);
  auto in_flight = c.engine->SaveAsync(2, Views(two));
  ASSERT_TRUE(in_flight.ok()) << in_flight.status();
  Touch(c.dir + "/in-flight");
  ASSERT_NO_FATAL_FAILURE(TrainUntilPreempted(**watch));
  Touch(c.dir + "/outcome", (*in_flight)->Done() ? "step 2 was durable at the signal"
                                                 : "step 2 in flight at the signal");
  c.fs->SetIoDelay(absl::ZeroDuration());
  // The final save, synchronous: it commits after step 2.
  auto final_save = c.engine->Save(3, Views(State(3)));
  ASSERT_TRUE(final_save.ok()) << final_save.status();
  ASSERT_TRUE(testing::WaitOrDie(**in_flight, kDeadline, "step 2").ok());
  ASSERT_TRUE(c.engine->Close().ok());
}

void DeadlineScenario(bool end_process) {
  Child c;
  ASSERT_NO_FATAL_FAILURE(c.Open());
  PreemptionOptions options;
  options.grace = absl::Seconds(1);
  options.end_process_at_deadline = end_process;
  auto watch = PreemptionWatch::Install(options);
  ASSERT_TRUE(watch.ok()) << watch.status();
  c.fs->SetIoDelay(absl::Milliseconds(200));  // far longer than the grace
  const std::vector<OwnedTensor> two = State(2);
  auto in_flight = c.engine->SaveAsync(2, Views(two));
  ASSERT_TRUE(in_flight.ok()) << in_flight.status();
  Touch(c.dir + "/in-flight");
  ASSERT_NO_FATAL_FAILURE(TrainUntilPreempted(**watch));
  // (With end_process, the process may end before this thread gets further.)
  const absl::Status outcome = testing::WaitOrDie(**in_flight, kDeadline, "step 2");
  auto later = c.engine->SaveAsync(3, Views(State(3)));
  Touch(c.dir + "/outcome", absl::StrCat(outcome.ToString(), "\n", later.status().ToString()));
  EXPECT_EQ(outcome.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(later.status().code(), absl::StatusCode::kDeadlineExceeded);
  if (end_process) {
    absl::SleepFor(kDeadline);  // the watch ends the process first
    ADD_FAILURE() << "the process was not ended at the deadline";
    return;
  }
  c.fs->SetIoDelay(absl::ZeroDuration());
  ASSERT_TRUE(c.engine->Close().ok());
  EXPECT_TRUE(Leftovers(c.root()).empty());
}

void DrainSlowlyScenario() {
  Child c;
  ASSERT_NO_FATAL_FAILURE(c.Open());
  PreemptionOptions options;
  options.grace = absl::Seconds(30);
  auto watch = PreemptionWatch::Install(options);
  ASSERT_TRUE(watch.ok()) << watch.status();
  c.fs->SetIoDelay(absl::Milliseconds(500));  // the drain takes far longer than the test
  const std::vector<OwnedTensor> two = State(2);
  auto in_flight = c.engine->SaveAsync(2, Views(two));
  ASSERT_TRUE(in_flight.ok()) << in_flight.status();
  Touch(c.dir + "/in-flight");
  ASSERT_NO_FATAL_FAILURE(TrainUntilPreempted(**watch));
  // The drain is under way once the save has written into its temp
  // directory (each write takes 500 ms): only then may the second signal come.
  ASSERT_NE(testing::AwaitWrittenTempDir(c.dir + "/root", 2, kDeadline), "")
      << "the save of step 2 never wrote into its temp directory";
  Touch(c.dir + "/draining");
  (void)testing::WaitOrDie(**in_flight, kDeadline, "step 2");
  ADD_FAILURE() << "the second signal did not end the process";
}

// Two ranks (threads here, processes in a job), both signalled: rank 1's
// disk is far too slow for the grace, rank 0's part is durable at once.
void SlowRankScenario() {
  const std::string dir = std::getenv(kDirEnv);
  std::vector<std::shared_ptr<FaultInjectionFileSystem>> fs;
  for (int r = 0; r < 2; ++r) fs.push_back(std::make_shared<FaultInjectionFileSystem>(PosixFileSystem()));
  // (A commit timeout far past the grace: the deadline is what ends the wait.)
  testing::Ranks ranks(dir + "/root", 2, testing::SmallChunks(), absl::Seconds(50),
                       [&](int r) -> std::shared_ptr<FileSystem> { return fs[r]; });
  std::vector<std::vector<OwnedTensor>> one = {testing::RankState(0, 1), testing::RankState(1, 1)};
  for (const absl::Status& s : ranks.Save({1, 1}, one)) ASSERT_TRUE(s.ok()) << s;
  PreemptionOptions options;
  options.grace = absl::Seconds(1);
  options.end_process_at_deadline = false;
  auto watch = PreemptionWatch::Install(options);
  ASSERT_TRUE(watch.ok()) << watch.status();
  fs[1]->SetIoDelay(absl::Seconds(3));  // each write: three times the grace
  std::vector<std::vector<OwnedTensor>> two = {testing::RankState(0, 2), testing::RankState(1, 2)};
  std::vector<std::shared_ptr<SaveHandle>> handles;
  for (int r = 0; r < 2; ++r) {
    auto handle = ranks.engine(r).SaveAsync(2, testing::Placed(two[r]));
    ASSERT_TRUE(handle.ok()) << handle.status();
    handles.push_back(std::move(*handle));
  }
  Touch(dir + "/in-flight");
  ASSERT_NO_FATAL_FAILURE(TrainUntilPreempted(**watch));
  std::vector<std::string> outcome;
  for (int r = 0; r < 2; ++r) {
    outcome.push_back(testing::WaitOrDie(*handles[r], kDeadline, absl::StrCat("rank ", r)).ToString());
  }
  for (int r = 0; r < 2; ++r) {
    outcome.push_back(ranks.engine(r).SaveAsync(3, testing::Placed(two[r])).status().ToString());
  }
  fs[1]->SetIoDelay(absl::ZeroDuration());
  ranks.CloseAll();
  Touch(dir + "/outcome", absl::StrJoin(outcome, "\n"));
}

void StormScenario() {
  const std::string dir = std::getenv(kDirEnv);
  struct sigaction earlier = {};
  earlier.sa_handler = StormEarlierHandler;  // chained: the storm does not end the process
  sigemptyset(&earlier.sa_mask);
  ASSERT_EQ(::sigaction(SIGUSR1, &earlier, nullptr), 0);
  PreemptionOptions options;
  options.signals = {SIGUSR1};
  options.grace = absl::Seconds(600);
  options.end_process_at_deadline = false;
  auto watch = PreemptionWatch::Install(options);
  ASSERT_TRUE(watch.ok()) << watch.status();
  EngineOptions engine_options = testing::SmallChunks();
  engine_options.delta.mode = DeltaOptions::Mode::kExact;
  engine_options.delta.full_every = 3;
  engine_options.lazy_staging = true;
  auto engine = Engine::Open(dir + "/root", engine_options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::atomic<bool> stop{false};
  std::atomic<int> sent{0};
  std::thread storm([&] {
    const pid_t self = ::getpid();
    while (!stop.load()) {
      DIR* tasks = ::opendir("/proc/self/task");
      if (tasks == nullptr) break;
      while (dirent* e = ::readdir(tasks)) {
        if (e->d_name[0] == '.') continue;
        ::syscall(SYS_tgkill, self, std::atoi(e->d_name), SIGUSR1);
        sent.fetch_add(1);
      }
      ::closedir(tasks);
      ::usleep(100);
    }
  });
  std::vector<OwnedTensor> state = State(10, 4);
  for (int i = 0; i < 400; ++i) {
    state.push_back(RandomTensor(absl::StrCat("tiny.", i), DType::kFloat32, {16}, i));
  }
  for (int64_t step = 1; step <= 12; ++step) {
    for (OwnedTensor& t : state) t.bytes[static_cast<size_t>(step) % t.bytes.size()] ^= 0x5a;
    auto handle = (*engine)->SaveAsync(step, Views(state));
    ASSERT_TRUE(handle.ok()) << handle.status();
    ASSERT_TRUE(testing::WaitOrDie(**handle, kDeadline, absl::StrCat("step ", step)).ok());
  }
  stop.store(true);
  storm.join();
  ASSERT_TRUE((*engine)->Close().ok());
  EXPECT_TRUE((*watch)->preempted());
  EXPECT_EQ((*watch)->signal(), SIGUSR1);
  EXPECT_GT(sent.load(), 100);
  EXPECT_GT(storm_earlier_calls.load(), 0);
  testing::ExpectCheckpointEquals(dir + "/root", 12, state);
  Touch(dir + "/storm-done");
}

// Not a test of its own (DISABLED_: ctest and a plain run leave it out):
// the entry point of the children SpawnChild starts.
TEST(PreemptionChild, DISABLED_Run) {
  const char* scenario = std::getenv(kScenarioEnv);
  if (scenario == nullptr) GTEST_FAIL() << "runs only as a child of the other cases";
  const std::string s = scenario;
  if (s == "drain") return DrainScenario();
  if (s == "deadline") return DeadlineScenario(true);
  if (s == "deadline_keep_running") return DeadlineScenario(false);
  if (s == "drain_slowly") return DrainSlowlyScenario();
  if (s == "storm") return StormScenario();
  if (s == "slow_rank") return SlowRankScenario();
  FAIL() << "unknown scenario " << s;
}

}  // namespace
}  // namespace ckpt
