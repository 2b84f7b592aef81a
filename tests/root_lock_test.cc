// One writer per root (ckpt/root_lock.h): a second engine fails at open,
// in this process or from another, naming the root and the holder; a holder
// that dies releases the root at once; a symlink or FIFO planted in the lock
// file's place is refused without being followed or waited on.
#include "ckpt/root_lock.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "ckpt/catalog.h"
#include "ckpt/engine.h"
#include "gtest/gtest.h"
#include "testing/fault_injection_file_system.h"
#include "test_util.h"

namespace ckpt {
namespace {

using testing::OwnedTensor;
using testing::RandomTensor;
using testing::ScratchDir;
using testing::Views;
using testing::WaitOrDie;

std::vector<OwnedTensor> SmallState() {
  std::vector<OwnedTensor> tensors;
  tensors.push_back(RandomTensor("layers.0.w", DType::kFloat32, {64, 64}, 1));
  tensors.push_back(RandomTensor("layers.0.b", DType::kFloat32, {64}, 2));
  return tensors;
}

absl::Status SaveOne(Engine& engine, int64_t step) {
  std::vector<OwnedTensor> tensors = SmallState();
  auto handle = engine.SaveAsync(step, Views(tensors));
  if (!handle.ok()) return handle.status();
  return WaitOrDie(**handle, absl::Seconds(60), absl::StrCat("save ", step));
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(RootLockTest, ASecondEngineOnTheRootFailsNamingItAndTheHolder) {
  ScratchDir dir;
  auto first = Engine::Open(dir.path(), EngineOptions{});
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = Engine::Open(dir.path(), EngineOptions{});
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
  const std::string message(second.status().message());
  EXPECT_NE(message.find(dir.path()), std::string::npos) << message;
  EXPECT_NE(message.find(absl::StrCat("ckpt engine, pid ", ::getpid())), std::string::npos) << message;
  // Still one writer, whose saves go on.
  ASSERT_TRUE(SaveOne(**first, 1).ok());
  // Close releases the root; the next engine continues the run.
  ASSERT_TRUE((*first)->Close().ok());
  auto third = Engine::Open(dir.path(), EngineOptions{});
  ASSERT_TRUE(third.ok()) << third.status();
  ASSERT_TRUE(SaveOne(**third, 2).ok());
  third->reset();  // destroying without Close releases it too
  auto fourth = Engine::Open(dir.path(), EngineOptions{});
  EXPECT_TRUE(fourth.ok()) << fourth.status();
}

// Holding the lock, a new engine knows that every `.tmp-step-*` left in ROOT
// is a dead writer's unfinished save, and removes it; a compaction in
// progress (`.tmp-compact-*`, under a retention lock held here) is not the
// engine's and stays. (tests/orphan_reclaim_test.cc: with the retention lock
// free it goes too.)
TEST(RootLockTest, OpeningRemovesSavesADeadWriterLeftAndNothingElse) {
  ScratchDir dir;
  {
    auto engine = Engine::Open(dir.path(), EngineOptions{});
    ASSERT_TRUE(engine.ok()) << engine.status();
    ASSERT_TRUE(SaveOne(**engine, 1).ok());
  }
  const std::string dead = dir.Join(".tmp-step-00000000000000000002-00000000deadbeef");
  const std::string compaction = dir.Join(".tmp-compact-step-00000000000000000001-0000000000000001");
  ASSERT_EQ(::mkdir(dead.c_str(), 0750), 0);
  { std::ofstream(dead + "/layers.0.shard") << "half a shard"; }
  ASSERT_EQ(::mkdir(compaction.c_str(), 0750), 0);
  auto compactor = LockRoot(dir.path(), RootLockKind::kRetention, "a compaction");
  ASSERT_TRUE(compactor.ok()) << compactor.status();
  auto engine = Engine::Open(dir.path(), EngineOptions{});
  ASSERT_TRUE(engine.ok()) << engine.status();
  struct stat st;
  EXPECT_NE(::stat(dead.c_str(), &st), 0) << "the dead writer's save was not removed";
  EXPECT_EQ(::stat(compaction.c_str(), &st), 0) << "a compaction in progress was removed";
  ASSERT_TRUE(SaveOne(**engine, 2).ok());  // the step the dead writer did not finish
  EXPECT_EQ(*ListSteps(dir.path()), (std::vector<int64_t>{1, 2}));
}

TEST(RootLockTest, AnEngineOnAnotherRootIsNotAffected) {
  ScratchDir a, b;
  auto first = Engine::Open(a.path(), EngineOptions{});
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = Engine::Open(b.path(), EngineOptions{});
  ASSERT_TRUE(second.ok()) << second.status();
}

TEST(RootLockTest, TheLockFileIsNoCheckpointAndHasARestrictiveMode) {
  ScratchDir dir;
  auto engine = Engine::Open(dir.path(), EngineOptions{});
  ASSERT_TRUE(engine.ok()) << engine.status();
  ASSERT_TRUE(SaveOne(**engine, 7).ok());
  auto steps = ListSteps(dir.path());
  ASSERT_TRUE(steps.ok()) << steps.status();
  EXPECT_EQ(*steps, std::vector<int64_t>{7});
  struct stat st;
  const std::string lock = dir.Join(".ckpt-writer.lock");
  ASSERT_EQ(::stat(lock.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_mode & 0007, 0u) << std::oct << st.st_mode;  // nothing for others
  EXPECT_EQ(st.st_mode & 0022, 0u) << std::oct << st.st_mode;  // writable by the owner only
  const std::string owner = ReadFile(lock);
  EXPECT_EQ(owner.rfind(absl::StrCat("ckpt engine, pid ", ::getpid(), " on host "), 0), 0u) << owner;
}

// A child process takes the writer lock and waits; the parent's engine fails
// naming the child's pid; SIGKILL releases the root at once.
TEST(RootLockTest, AnotherProcessIsNamedAndItsDeathReleasesTheRoot) {
  ScratchDir dir;
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(ready[0]);
    auto lock = LockRoot(dir.path(), RootLockKind::kWriter, "test child");
    const char byte = lock.ok() ? 'y' : 'n';
    (void)!::write(ready[1], &byte, 1);
    for (int i = 0; i < 600; ++i) ::sleep(1);  // killed long before
    ::_exit(0);
  }
  ::close(ready[1]);
  pollfd p{ready[0], POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 20000), 1) << "the child did not lock within 20 s";
  char byte = 0;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1);
  ::close(ready[0]);
  ASSERT_EQ(byte, 'y');

  auto blocked = Engine::Open(dir.path(), EngineOptions{});
  ASSERT_FALSE(blocked.ok());
  EXPECT_EQ(blocked.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(blocked.status().message().find(absl::StrCat("test child, pid ", child)), std::string::npos)
      << blocked.status();

  ASSERT_EQ(::kill(child, SIGKILL), 0);
  int wstatus = 0;
  ASSERT_EQ(::waitpid(child, &wstatus, 0), child);
  auto engine = Engine::Open(dir.path(), EngineOptions{});
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_TRUE(SaveOne(**engine, 1).ok());
}

TEST(RootLockTest, ASymlinkInPlaceOfTheLockIsRefusedAndNotFollowed) {
  ScratchDir dir, outside;
  const std::string victim = outside.Join("victim");
  { std::ofstream(victim) << "precious\n"; }
  for (const std::string& target : {victim, outside.Join("missing")}) {
    const std::string lock = dir.Join(".ckpt-writer.lock");
    ::unlink(lock.c_str());
    ASSERT_EQ(::symlink(target.c_str(), lock.c_str()), 0);
    auto engine = Engine::Open(dir.path(), EngineOptions{});
    ASSERT_FALSE(engine.ok()) << target;
    EXPECT_EQ(engine.status().code(), absl::StatusCode::kFailedPrecondition) << engine.status();
    EXPECT_NE(engine.status().message().find("symbolic link"), std::string::npos) << engine.status();
  }
  EXPECT_EQ(ReadFile(victim), "precious\n");
  struct stat st;
  EXPECT_NE(::stat(outside.Join("missing").c_str(), &st), 0) << "a dangling link was followed";
}

TEST(RootLockTest, AFifoOrDirectoryInPlaceOfTheLockFailsWithoutHanging) {
  for (bool fifo : {true, false}) {
    ScratchDir dir;
    const std::string lock = dir.Join(".ckpt-writer.lock");
    ASSERT_EQ(fifo ? ::mkfifo(lock.c_str(), 0600) : ::mkdir(lock.c_str(), 0700), 0);
    absl::Status status;
    testing::RunOrDie([&] { status = Engine::Open(dir.path(), EngineOptions{}).status(); },
                      absl::Seconds(20), "Engine::Open over a planted lock");
    EXPECT_FALSE(status.ok());
    EXPECT_NE(status.message().find(".ckpt-writer.lock"), std::string::npos) << status;
  }
}

TEST(RootLockTest, RetentionJobsExcludeEachOtherButNotTheWriter) {
  ScratchDir dir;
  auto job = LockRoot(dir.path(), RootLockKind::kRetention, "retention A");
  ASSERT_TRUE(job.ok()) << job.status();
  auto engine = Engine::Open(dir.path(), EngineOptions{});
  ASSERT_TRUE(engine.ok()) << engine.status();
  auto second = LockRoot(dir.path(), RootLockKind::kRetention, "retention B");
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find("retention A, pid"), std::string::npos) << second.status();
  job->reset();
  EXPECT_TRUE(LockRoot(dir.path(), RootLockKind::kRetention, "retention B").ok());
}

// The lock goes through the FileSystem seam: a failing lock call fails the
// open with its error, and leaves nothing locked behind.
TEST(RootLockTest, AFailedLockCallFailsTheOpenAndLeavesTheRootFree) {
  ScratchDir dir;
  auto fs = std::make_shared<testing::FaultInjectionFileSystem>(PosixFileSystem());
  fs->RecordCalls(true);
  EngineOptions options;
  options.fs = fs;
  { ASSERT_TRUE(Engine::Open(dir.path(), options).ok()); }
  uint64_t lock_call = 0;
  const std::vector<std::string> calls = fs->recorded_calls();
  for (size_t i = 0; i < calls.size(); ++i) {
    if (calls[i].rfind("lock ", 0) == 0 && calls[i].find(".ckpt-writer.lock") != std::string::npos) {
      lock_call = i + 1;
    }
  }
  ASSERT_GT(lock_call, 0u) << "Engine::Open took no lock through the file system";
  for (testing::Fault fault : {testing::Fault::kEio, testing::Fault::kEnospc}) {
    fs->ResetCallCount();
    fs->FailAt(lock_call, fault);
    auto failed = Engine::Open(dir.path(), options);
    ASSERT_FALSE(failed.ok()) << testing::FaultName(fault);
    EXPECT_NE(failed.status().message().find(".ckpt-writer.lock"), std::string::npos) << failed.status();
    fs->ClearFaults();
    auto engine = Engine::Open(dir.path(), options);
    ASSERT_TRUE(engine.ok()) << engine.status();
  }
}

}  // namespace
}  // namespace ckpt
