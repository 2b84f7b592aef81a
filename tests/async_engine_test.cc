// The asynchronous engine: staging semantics, backpressure, sticky errors,
// close/cancel, watchdog, metrics, compression.
// (About 800 lines, over the house ~400: one fixture and the userfaultfd
// stalling helpers serve every case; the cases are short and independent.)
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ckpt/catalog.h"
#include "ckpt/engine.h"
#include "ckpt/log.h"
#include "ckpt/reader.h"
#include "gtest/gtest.h"
#include "test_util.h"
#include "testing/fault_injection_file_system.h"

// AStagingPoolThatCannotBeAllocatedFailsOpenCleanly asks for more memory
// than exists: under the sanitizers that must fail the allocation, as it
// does in the release build, not abort the binary.
#if defined(__SANITIZE_ADDRESS__)
extern "C" const char* __asan_default_options() { return "allocator_may_return_null=1"; }
#endif
#if defined(__SANITIZE_THREAD__)
extern "C" const char* __tsan_default_options() { return "allocator_may_return_null=1"; }
#endif

namespace ckpt {
namespace {

using testing::Fault;
using testing::FaultInjectionFileSystem;
using testing::OwnedTensor;
using testing::RandomTensor;
using testing::ExpectCheckpointEquals;
using testing::ScratchDir;
using testing::SmallChunks;
using testing::Views;

std::vector<OwnedTensor> SomeState(uint64_t seed, int64_t elements = 50000) {
  std::vector<OwnedTensor> state;
  for (int l = 0; l < 3; ++l) {
    const std::string p = "layers." + std::to_string(l);
    state.push_back(RandomTensor(p + ".attn.weight", DType::kFloat32, {elements}, seed * 100 + l));
    state.push_back(RandomTensor(p + ".norm.bias", DType::kBFloat16, {77}, seed * 100 + 50 + l));
  }
  return state;
}

// `StallingBytes` holds a copy of some bytes that no thread can read until
// `Release`: a read before then waits in the kernel (a userfaultfd page
// fault on memory not filled yet), so a test can stop a copy out of a
// tensor at an exact point, and see that the reader got there. Linux
// userfaultfd, user-mode faults only (allowed unprivileged since 5.11).
// The destructor releases.
class StallingBytes {
 public:
  // Errors: userfaultfd is unavailable here (an old kernel, or a seccomp
  // policy that refuses it).
  static absl::StatusOr<std::unique_ptr<StallingBytes>> Create(const std::vector<uint8_t>& bytes) {
    auto held = std::unique_ptr<StallingBytes>(new StallingBytes);
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    held->length_ = std::max<size_t>(page, (bytes.size() + page - 1) / page * page);
    for (void** map : {&held->memory_, &held->contents_}) {
      *map = mmap(nullptr, held->length_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                  -1, 0);
      if (*map == MAP_FAILED) {
        *map = nullptr;
        return absl::ResourceExhaustedError(absl::StrCat("mmap: ", std::strerror(errno)));
      }
    }
    std::memcpy(held->contents_, bytes.data(), bytes.size());
    held->fd_ =
        static_cast<int>(syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY));
    if (held->fd_ < 0) {
      return absl::UnavailableError(absl::StrCat("userfaultfd: ", std::strerror(errno)));
    }
    uffdio_api api{};
    api.api = UFFD_API;
    if (ioctl(held->fd_, UFFDIO_API, &api) != 0) {
      return absl::UnavailableError(absl::StrCat("UFFDIO_API: ", std::strerror(errno)));
    }
    uffdio_register reg{};
    reg.range.start = reinterpret_cast<uintptr_t>(held->memory_);
    reg.range.len = held->length_;
    reg.mode = UFFDIO_REGISTER_MODE_MISSING;
    if (ioctl(held->fd_, UFFDIO_REGISTER, &reg) != 0) {
      return absl::UnavailableError(absl::StrCat("UFFDIO_REGISTER: ", std::strerror(errno)));
    }
    return held;
  }

  ~StallingBytes() {
    if (fd_ >= 0) {
      (void)Release();
      close(fd_);
    }
    if (memory_ != nullptr) munmap(memory_, length_);
    if (contents_ != nullptr) munmap(contents_, length_);
  }

  const void* data() const { return memory_; }

  // Waits at most `deadline` for a thread to read the bytes (and wait);
  // true if one did.
  bool WaitForReader(absl::Duration deadline) {
    const absl::Time until = absl::Now() + deadline;
    pollfd p{fd_, POLLIN, 0};
    int ready;
    do {
      const absl::Duration left = std::max(until - absl::Now(), absl::ZeroDuration());
      ready = poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(left)));
    } while (ready < 0 && errno == EINTR);
    if (ready != 1) return false;
    uffd_msg msg{};
    return read(fd_, &msg, sizeof(msg)) == static_cast<ssize_t>(sizeof(msg)) &&
           msg.event == UFFD_EVENT_PAGEFAULT;
  }

  // Fills in the bytes: waiting readers resume, later ones do not wait.
  absl::Status Release() {
    if (released_) return absl::OkStatus();
    uffdio_copy copy{};
    copy.dst = reinterpret_cast<uintptr_t>(memory_);
    copy.src = reinterpret_cast<uintptr_t>(contents_);
    copy.len = length_;
    while (ioctl(fd_, UFFDIO_COPY, &copy) != 0) {
      if (errno != EAGAIN) {
        return absl::InternalError(absl::StrCat("UFFDIO_COPY: ", std::strerror(errno)));
      }
      // Part was copied: go on from there.
      const uint64_t done = copy.copy > 0 ? static_cast<uint64_t>(copy.copy) : 0;
      copy.dst += done;
      copy.src += done;
      copy.len -= done;
      copy.copy = 0;
    }
    released_ = true;
    return absl::OkStatus();
  }

 private:
  StallingBytes() = default;

  void* memory_ = nullptr;    // registered: reads fault until `Release`
  void* contents_ = nullptr;  // what `Release` fills it with
  size_t length_ = 0;
  int fd_ = -1;
  bool released_ = false;
};

TEST(AsyncEngineTest, MutatingAfterSaveAsyncReturnsDoesNotLeak) {
  ScratchDir dir;
  auto engine = Engine::Open(dir.Join("root"), SmallChunks());
  ASSERT_TRUE(engine.ok());
  std::vector<OwnedTensor> state = SomeState(1);
  const std::vector<OwnedTensor> at_save = state;
  auto handle = (*engine)->SaveAsync(1, Views(state));
  ASSERT_TRUE(handle.ok()) << handle.status();
  // Eager mode: the bytes are staged when SaveAsync returns.
  for (auto& t : state) std::memset(t.bytes.data(), 0x5A, t.bytes.size());
  ASSERT_TRUE((*handle)->Wait().ok());
  ExpectCheckpointEquals(dir.Join("root"), 1, at_save);
}

TEST(AsyncEngineTest, LazyModeMutatingAfterWaitStagedDoesNotLeak) {
  ScratchDir dir;
  EngineOptions options = SmallChunks();
  options.lazy_staging = true;
  auto engine = Engine::Open(dir.Join("root"), options);
  ASSERT_TRUE(engine.ok());
  for (int64_t step = 1; step <= 5; ++step) {
    std::vector<OwnedTensor> state = SomeState(step);
    const std::vector<OwnedTensor> at_save = state;
    auto handle = (*engine)->SaveAsync(step, Views(state));
    ASSERT_TRUE(handle.ok());
    ASSERT_TRUE((*handle)->WaitStaged().ok());
    for (auto& t : state) std::memset(t.bytes.data(), 0xA5, t.bytes.size());
    ASSERT_TRUE((*handle)->Wait().ok());
    ExpectCheckpointEquals(dir.Join("root"), step, at_save);
  }
}

TEST(AsyncEngineTest, DoneIsFalseUntilCommitted) {
  ScratchDir dir;
  auto fs = std::make_shared<FaultInjectionFileSystem>(PosixFileSystem());
  EngineOptions options = SmallChunks();
  options.fs = fs;
  auto engine = Engine::Open(dir.Join("root"), options);
  ASSERT_TRUE(engine.ok());
  fs->SetIoDelay(absl::Milliseconds(5));
  std::vector<OwnedTensor> state = SomeState(1);
  auto handle = (*engine)->SaveAsync(1, Views(state));
  ASSERT_TRUE(handle.ok());
  EXPECT_FALSE((*handle)->Done());
  ASSERT_TRUE((*handle)->Wait().ok());
  EXPECT_TRUE((*handle)->Done());
  SaveStats stats = (*handle)->stats();
  EXPECT_EQ(stats.step, 1);
  EXPECT_GT(stats.persist_s, 0);
  EXPECT_LE(stats.blocked_s, stats.seconds);
  // The caller's CPU time is part of its blocked time (and the copy and
  // hashing take some CPU).
  EXPECT_GT(stats.blocked_cpu_s, 0);
  EXPECT_LE(stats.blocked_cpu_s, stats.blocked_s + 0.01);
  EXPECT_FALSE(stats.skipped);
}

// Many saves back to back on a slow disk: memory stays within the budget,
// every save commits (wait policy) and verifies.
TEST(AsyncEngineTest, WaitPolicyOnSlowDiskStaysInBudget) {
  ScratchDir dir;
  auto fs = std::make_shared<FaultInjectionFileSystem>(PosixFileSystem());
  EngineOptions options = SmallChunks();
  options.fs = fs;
  options.staging_bytes = 8 * (64 << 10);  // smaller than one save: saves stream
  auto engine = Engine::Open(dir.Join("root"), options);
  ASSERT_TRUE(engine.ok());
  fs->SetIoDelay(absl::Milliseconds(1));
  std::vector<std::vector<OwnedTensor>> states;
  std::vector<std::shared_ptr<SaveHandle>> handles;
  for (int64_t step = 1; step <= 8; ++step) {
    states.push_back(SomeState(step));
    auto handle = (*engine)->SaveAsync(step, Views(states.back()));
    ASSERT_TRUE(handle.ok()) << handle.status();
    EngineStats s = (*engine)->stats();
    EXPECT_EQ(s.staging_bytes, options.staging_bytes);
    handles.push_back(*handle);
  }
  for (auto& h : handles) EXPECT_TRUE(h->Wait().ok());
  for (int64_t step = 1; step <= 8; ++step) {
    ExpectCheckpointEquals(dir.Join("root"), step, states[step - 1]);
  }
  EngineStats s = (*engine)->stats();
  EXPECT_EQ(s.saves_committed, 8u);
  EXPECT_EQ(s.saves_skipped, 0u);
  EXPECT_EQ(s.staging_bytes, options.staging_bytes);
}

// Fewer staging chunks than the persister's wake-up batch: the stager must
// wake the persister before it waits for a chunk, or both wait forever.
TEST(AsyncEngineTest, PoolSmallerThanAWakeBatchStillStreams) {
  ScratchDir dir;
  EngineOptions options = SmallChunks();
  options.staging_bytes = 3 * (64 << 10);
  auto engine = Engine::Open(dir.Join("root"), options);
  ASSERT_TRUE(engine.ok());
  std::vector<OwnedTensor> state = SomeState(1);  // ~600 KB: many times the pool
  ASSERT_TRUE((*engine)->Save(1, Views(state)).ok());
  ExpectCheckpointEquals(dir.Join("root"), 1, state);
}

// By default an eager save's writes wait until the caller's copy is done:
// the first write starts after SaveAsync stopped blocking (exact, not
// timing-dependent: persist_s runs from the first write).
TEST(AsyncEngineTest, EagerSaveWritesOnlyOnceStaged) {
  ScratchDir dir;
  auto engine = Engine::Open(dir.Join("root"), SmallChunks());
  ASSERT_TRUE(engine.ok());
  std::vector<OwnedTensor> state = SomeState(1, 1 << 20);  // 12 MiB: ~200 chunks
  for (int64_t step = 1; step <= 3; ++step) {
    auto stats = (*engine)->Save(step, Views(state));
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_GE(stats->seconds - stats->persist_s, stats->blocked_s) << "step " << step;
    ExpectCheckpointEquals(dir.Join("root"), step, state);
  }
}

// ... unless staging memory runs short, and when asked to overlap. Checked
// by event order, not by timing: the save's last tensor is held out of reach
// (`StallingBytes`), so staging cannot finish until the test lets it, and
// while the stager waits there a shard write must already have been
// submitted. (With two or more copy threads the stager hands chunks on per
// 32 MiB batch of copies (engine/stager.cc, kBatchBytes), so a save shorter
// than that cannot write before staging ends: the threaded case puts a full
// batch ahead of the held tensor.)
TEST(AsyncEngineTest, EagerSaveWritesEarlyWhenPoolIsShortOrWhenAsked) {
  struct Case {
    const char* what;
    bool overlap;            // write_during_eager_staging
    int staging_threads;
    size_t staging_bytes;    // 0: the pool holds the whole save
    int64_t early_elements;  // float32 elements staged before the held tensor
  };
  const Case cases[] = {
      {"write_during_eager_staging, the caller copies alone", true, 1, 0, 1 << 18},  // 16 chunks
      {"write_during_eager_staging, 2 copy threads", true, 2, 0, (33 << 20) / 4},   // > 1 batch
      {"pool smaller than the save", false, 0, 16 * (64 << 10), 1 << 19},          // 32 chunks
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    ScratchDir dir;
    auto fs = std::make_shared<FaultInjectionFileSystem>(PosixFileSystem());
    EngineOptions options = SmallChunks();
    options.fs = fs;
    options.write_during_eager_staging = c.overlap;
    options.staging_threads = c.staging_threads;
    options.staging_bytes = c.staging_bytes;
    auto engine = Engine::Open(dir.Join("root"), options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    const std::vector<OwnedTensor> state = {
        RandomTensor("early.weight", DType::kFloat32, {c.early_elements}, 1),
        RandomTensor("late.weight", DType::kFloat32, {1 << 16}, 2)};
    auto late = StallingBytes::Create(state[1].bytes);
    if (!late.ok()) GTEST_SKIP() << "cannot hold a tensor's bytes back: " << late.status();
    std::vector<TensorView> views = Views(state);
    views[1].data = (*late)->data();
    fs->RecordCalls(true);

    std::atomic<bool> returned{false};
    absl::StatusOr<std::shared_ptr<SaveHandle>> handle = absl::UnknownError("not called");
    std::thread saver([&] {
      handle = (*engine)->SaveAsync(1, views);
      returned = true;
    });
    // The stager reaches the held tensor and waits in its copy...
    const bool reached = (*late)->WaitForReader(absl::Seconds(60));
    // ... where a shard write must come while it waits.
    bool wrote = false;
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (reached && !wrote && absl::Now() < deadline) {
      for (const std::string& call : fs->recorded_calls()) {
        wrote |= absl::StartsWith(call, "IoOp write ") && absl::StrContains(call, ".shard@");
      }
      if (!wrote) absl::SleepFor(absl::Milliseconds(1));
    }
    const bool returned_before_write = returned.load();
    const absl::Status released = (*late)->Release();
    testing::RunOrDie([&] { saver.join(); }, absl::Seconds(60), "SaveAsync after the release");
    ASSERT_TRUE(released.ok()) << released;
    ASSERT_TRUE(reached) << "the stager never read the held tensor";
    EXPECT_TRUE(wrote) << "no shard write was submitted while staging waited for its last tensor";
    EXPECT_FALSE(returned_before_write) << "SaveAsync returned while its last tensor was held";
    ASSERT_TRUE(handle.ok()) << handle.status();
    const absl::Status saved = testing::WaitOrDie(**handle, absl::Seconds(60), "the stalled save");
    ASSERT_TRUE(saved.ok()) << saved;
    // The handle's figures agree: the first write came before the caller was released.
    const SaveStats stats = (*handle)->stats();
    EXPECT_LT(stats.seconds - stats.persist_s, stats.blocked_s);
    ExpectCheckpointEquals(dir.Join("root"), 1, state);
  }
}

TEST(AsyncEngineTest, SkipPolicySkipsWhileBusyAndSaysSo) {
  ScratchDir dir;
  auto fs = std::make_shared<FaultInjectionFileSystem>(PosixFileSystem());
  EngineOptions options = SmallChunks();
  options.fs = fs;
  options.when_busy = EngineOptions::BusyPolicy::kSkip;
  options.metrics_jsonl_path = dir.Join("metrics.jsonl");
  auto engine = Engine::Open(dir.Join("root"), options);
  ASSERT_TRUE(engine.ok());
  std::vector<OwnedTensor> state = SomeState(1);
  ASSERT_TRUE((*engine)->Save(1, Views(state)).ok());  // sizes the pool: one save
  fs->SetIoDelay(absl::Milliseconds(20));
  auto first = (*engine)->SaveAsync(2, Views(state));
  ASSERT_TRUE(first.ok());
  auto second = (*engine)->SaveAsync(3, Views(state));  // pool held by step 2
  ASSERT_TRUE(second.ok());
  EXPECT_TRUE((*second)->skipped());
  EXPECT_TRUE((*second)->Done());
  EXPECT_TRUE((*second)->Wait().ok());
  EXPECT_TRUE((*second)->stats().skipped);
  ASSERT_TRUE((*first)->Wait().ok());
  EXPECT_FALSE((*first)->skipped());
  auto steps = ListSteps(dir.Join("root"));
  EXPECT_EQ(*steps, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ((*engine)->stats().saves_skipped, 1u);
  // The metrics log has a line for the skipped save too, after the save
  // that was in flight (the training thread wrote nothing).
  ASSERT_TRUE((*engine)->Close().ok());
  std::ifstream jsonl(dir.Join("metrics.jsonl"));
  std::vector<std::string> outcomes;
  for (std::string line; std::getline(jsonl, line);) {
    auto j = nlohmann::json::parse(line);
    outcomes.push_back(absl::StrCat(j["step"].get<int64_t>(), " ", j["outcome"].get<std::string>()));
  }
  EXPECT_EQ(outcomes, (std::vector<std::string>{"1 committed", "2 committed", "3 skipped"}));
}

TEST(AsyncEngineTest, BackgroundErrorIsReportedByHandleAndNextSave) {
  ScratchDir dir;
  auto fs = std::make_shared<FaultInjectionFileSystem>(PosixFileSystem());
  EngineOptions options = SmallChunks();
  options.fs = fs;
  auto engine = Engine::Open(dir.Join("root"), options);
  ASSERT_TRUE(engine.ok());
  std::vector<OwnedTensor> state = SomeState(1);
  fs->ResetCallCount();
  fs->FailAt(5, Fault::kEnospc);  // somewhere among the shard writes
  auto handle = (*engine)->SaveAsync(1, Views(state));
  ASSERT_TRUE(handle.ok());
  // The handle reports it...
  absl::Status s = (*handle)->Wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  // ...and having been seen, the next save is not blocked by it.
  fs->ClearFaults();
  auto second = (*engine)->SaveAsync(2, Views(state));
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_TRUE((*second)->Wait().ok());
  // An error nobody waited for is reported by the next SaveAsync, once.
  fs->ResetCallCount();
  fs->FailAt(5, Fault::kEio);
  auto unseen = (*engine)->SaveAsync(3, Views(state));
  ASSERT_TRUE(unseen.ok()) << unseen.status();
  while (!(*unseen)->Done()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  fs->ClearFaults();
  auto next = (*engine)->SaveAsync(4, Views(state));
  ASSERT_FALSE(next.ok());
  EXPECT_NE(std::string(next.status().message()).find("earlier save failed"), std::string::npos)
      << next.status();
  EXPECT_TRUE((*engine)->SaveAsync(4, Views(state)).ok());
  EXPECT_TRUE((*engine)->Close().ok());
  auto steps = ListSteps(dir.Join("root"));
  EXPECT_EQ(*steps, (std::vector<int64_t>{2, 4}));
}

TEST(AsyncEngineTest, CloseReportsAnUnseenError) {
  ScratchDir dir;
  auto fs = std::make_shared<FaultInjectionFileSystem>(PosixFileSystem());
  EngineOptions options = SmallChunks();
  options.fs = fs;
  auto engine = Engine::Open(dir.Join("root"), options);
  ASSERT_TRUE(engine.ok());
  std::vector<OwnedTensor> state = SomeState(1);
  fs->ResetCallCount();
  fs->FailAt(3, Fault::kEio);
  ASSERT_TRUE((*engine)->SaveAsync(1, Views(state)).ok());
  absl::Status closed = (*engine)->Close();
  EXPECT_FALSE(closed.ok());
  EXPECT_TRUE((*engine)->Close().ok());  // reported once
  EXPECT_FALSE((*engine)->SaveAsync(2, Views(state)).ok());  // closed
}

TEST(AsyncEngineTest, CancelAbandonsInFlightSavesAndCleansUp) {
  ScratchDir dir;
  auto fs = std::make_shared<FaultInjectionFileSystem>(PosixFileSystem());
  EngineOptions options = SmallChunks();
  options.fs = fs;
  auto engine = Engine::Open(dir.Join("root"), options);
  ASSERT_TRUE(engine.ok());
  std::vector<OwnedTensor> state = SomeState(1, 400000);
  ASSERT_TRUE((*engine)->Save(1, Views(state)).ok());
  fs->SetIoDelay(absl::Milliseconds(10));
  auto handle = (*engine)->SaveAsync(2, Views(state));
  ASSERT_TRUE(handle.ok());
  (void)(*engine)->Close(Engine::CloseMode::kCancel);
  absl::Status s = (*handle)->Wait();
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  auto names = PosixFileSystem()->ListDir(dir.Join("root"));
  ASSERT_TRUE(names.ok());
  for (const std::string& name : *names) {
    EXPECT_TRUE(name == "LATEST" || name == StepDirName(1) || testing::IsRootLockFile(name))
        << "left behind: " << name;
  }
  ExpectCheckpointEquals(dir.Join("root"), 1, state);
}

// Close(kCancel) while a lazy save is still copying: the save reports the
// documented kCancelled, never the kAborted ("writing it failed") that the
// stager used to return when it saw the abort flag before the pool's cancel.
TEST(AsyncEngineTest, CancelDuringLazyStagingReportsCancelled) {
  for (int round = 0; round < 5; ++round) {
    ScratchDir dir;
    EngineOptions options = SmallChunks();
    options.lazy_staging = true;
    auto engine = Engine::Open(dir.Join("root"), options);
    ASSERT_TRUE(engine.ok());
    // Big enough that the lazy stager is still copying when Close runs.
    std::vector<OwnedTensor> state = SomeState(round + 1, 4'000'000);
    auto handle = (*engine)->SaveAsync(1, Views(state));
    ASSERT_TRUE(handle.ok());
    (void)(*engine)->Close(Engine::CloseMode::kCancel);
    absl::Status s = testing::WaitOrDie(**handle, absl::Seconds(60), "cancelled lazy save");
    if (s.ok()) continue;  // it won the race and committed: allowed
    EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << "round " << round << ": " << s;
    // Staging may have finished before the cancel (the tensors were free to
    // change; only the writing was abandoned): OK. Otherwise kCancelled.
    absl::Status staged = (*handle)->WaitStaged();
    EXPECT_TRUE(staged.ok() || staged.code() == absl::StatusCode::kCancelled)
        << "round " << round << ": " << staged;
  }
}

// A fixed staging pool that cannot be allocated fails Open with the
// allocation's error, and the root is free for the next engine (the
// half-started engine used to crash on its way out: no persister to stop).
TEST(AsyncEngineTest, AStagingPoolThatCannotBeAllocatedFailsOpenCleanly) {
  ScratchDir dir;
  EngineOptions options = SmallChunks();
  options.staging_bytes = size_t{1} << 50;  // 1 PiB: more than any address space here
  auto engine = Engine::Open(dir.Join("root"), options);
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kResourceExhausted) << engine.status();
  auto next = Engine::Open(dir.Join("root"), SmallChunks());
  ASSERT_TRUE(next.ok()) << next.status();
  std::vector<OwnedTensor> state = SomeState(1);
  ASSERT_TRUE((*next)->Save(1, Views(state)).ok());
}

TEST(AsyncEngineTest, ReserveStagingGrowsThePoolBeforeTheFirstSave) {
  ScratchDir dir;
  auto engine = Engine::Open(dir.Join("root"), SmallChunks());
  ASSERT_TRUE(engine.ok());
  std::vector<OwnedTensor> state = SomeState(1);
  uint64_t bytes = 0;
  for (const OwnedTensor& t : state) bytes += t.bytes.size();
  EXPECT_EQ((*engine)->stats().staging_bytes, 0u);
  ASSERT_TRUE((*engine)->ReserveStaging(Views(state), /*wait=*/true).ok());
  const size_t reserved = (*engine)->stats().staging_bytes;
  EXPECT_GE(reserved, bytes);
  // The save fits: the pool is not reallocated.
  ASSERT_TRUE((*engine)->Save(1, Views(state)).ok());
  EXPECT_EQ((*engine)->stats().staging_bytes, reserved);
  ExpectCheckpointEquals(dir.Join("root"), 1, state);
}

TEST(AsyncEngineTest, SaveRightAfterAnAsyncReservationWaitsForIt) {
  ScratchDir dir;
  EngineOptions options = SmallChunks();
  options.delta.mode = DeltaOptions::Mode::kExact;
  auto engine = Engine::Open(dir.Join("root"), options);
  ASSERT_TRUE(engine.ok());
  std::vector<OwnedTensor> state = SomeState(2, 400000);
  ASSERT_TRUE((*engine)->ReserveStaging(Views(state)).ok());
  auto handle = (*engine)->SaveAsync(1, Views(state));
  ASSERT_TRUE(handle.ok()) << handle.status();
  ASSERT_TRUE(testing::WaitOrDie(**handle, absl::Seconds(60), "save after reservation").ok());
  const size_t reserved = (*engine)->stats().staging_bytes;
  ASSERT_TRUE((*engine)->ReserveStaging(Views(state), /*wait=*/true).ok());  // already enough
  EXPECT_EQ((*engine)->stats().staging_bytes, reserved);
  ASSERT_TRUE((*engine)->Close().ok());
  ExpectCheckpointEquals(dir.Join("root"), 1, state);
  EXPECT_EQ((*engine)->ReserveStaging(Views(state)).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(AsyncEngineTest, ReserveStagingDoesNothingWhenThePoolIsFixed) {
  ScratchDir dir;
  EngineOptions options = SmallChunks();
  options.staging_bytes = 4 * options.io.chunk_bytes;
  auto engine = Engine::Open(dir.Join("root"), options);
  ASSERT_TRUE(engine.ok());
  std::vector<OwnedTensor> state = SomeState(3);
  ASSERT_TRUE((*engine)->ReserveStaging(Views(state), /*wait=*/true).ok());
  EXPECT_EQ((*engine)->stats().staging_bytes, 4 * options.io.chunk_bytes);
}

// The staging memory a pool reserved ahead of the saves is prepared as, on
// this machine ("cudaHostRegister" with a GPU, "mlock" where page-locking is
// allowed, "pageable" where it is refused).
std::string ReservedStagingMemory(const std::vector<OwnedTensor>& state) {
  ScratchDir dir;
  auto engine = Engine::Open(dir.Join("root"), SmallChunks());
  if (!engine.ok()) return "?";
  if (!(*engine)->ReserveStaging(Views(state), /*wait=*/true).ok()) return "?";
  return (*engine)->stats().staging_memory;
}

// What a log sink saw, for the length of a test.
class CapturedLog {
 public:
  CapturedLog() {
    SetLogThreshold(LogSeverity::kInfo);
    SetLogSink([this](LogSeverity, absl::string_view m) {
      std::lock_guard<std::mutex> lock(mu_);
      lines_.emplace_back(m);
    });
  }
  ~CapturedLog() {
    SetLogSink(nullptr);
    const char* env = std::getenv("CKPT_LOG");  // the level the suite ran with
    const std::string level = env != nullptr ? env : "info";
    SetLogThreshold(level == "debug"     ? LogSeverity::kDebug
                    : level == "warning" ? LogSeverity::kWarning
                    : level == "error"   ? LogSeverity::kError
                    : level == "off"     ? LogSeverity::kOff
                                         : LogSeverity::kInfo);
  }
  bool Has(absl::string_view needle) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const std::string& l : lines_) {
      if (absl::StrContains(l, needle)) return true;
    }
    return false;
  }

 private:
  std::mutex mu_;
  std::vector<std::string> lines_;
};

TEST(AsyncEngineTest, AFirstSaveWithoutAReservationStagesUnpinnedAndThePoolIsPinnedBehindIt) {
  std::vector<OwnedTensor> state = SomeState(5, 600000);
  const std::string pinned = ReservedStagingMemory(state);
  if (geteuid() == 0) EXPECT_NE(pinned, "pageable") << "as root, staging memory can be locked";
  for (bool lazy : {false, true}) {
    SCOPED_TRACE(lazy ? "lazy" : "eager");
    CapturedLog log;
    ScratchDir dir;
    EngineOptions options = SmallChunks();
    options.lazy_staging = lazy;
    auto engine = Engine::Open(dir.Join("root"), options);
    ASSERT_TRUE(engine.ok());
    // The first save finds no pool: it grows one without pinning (its caller
    // does not wait for that), says so, and counts it.
    auto first = (*engine)->SaveAsync(1, Views(state));
    ASSERT_TRUE(first.ok()) << first.status();
    ASSERT_TRUE(testing::WaitOrDie(**first, absl::Seconds(60), "first save").ok());
    EXPECT_EQ((*first)->stats().staging_memory, "pageable");
    EXPECT_EQ((*engine)->stats().saves_staged_unpinned, 1u);
    EXPECT_TRUE(log.Has("unpinned")) << "the first save's log line";
    // Once it is written the pool is pinned behind it: the next save stages
    // into pinned memory, and nothing is counted again.
    auto second = (*engine)->SaveAsync(2, Views(state));
    ASSERT_TRUE(second.ok()) << second.status();
    ASSERT_TRUE(testing::WaitOrDie(**second, absl::Seconds(60), "second save").ok());
    EXPECT_EQ((*second)->stats().staging_memory, pinned);
    EXPECT_EQ((*engine)->stats().staging_memory, pinned);
    EXPECT_EQ((*engine)->stats().saves_staged_unpinned, 1u);
    ASSERT_TRUE((*engine)->Close().ok());
    ExpectCheckpointEquals(dir.Join("root"), 1, state);
    ExpectCheckpointEquals(dir.Join("root"), 2, state);
  }
}

// The pool's background pinning waits for the saves in flight, and a save
// never waits for it meanwhile: a skipping (or lazy) save started while the
// first save is still writing must not be held until that save is written.
TEST(AsyncEngineTest, PinningBehindTheFirstSaveNeverHoldsTheNextSave) {
  ScratchDir dir;
  auto fs = std::make_shared<FaultInjectionFileSystem>(PosixFileSystem());
  EngineOptions options = SmallChunks();
  options.fs = fs;
  options.when_busy = EngineOptions::BusyPolicy::kSkip;
  auto engine = Engine::Open(dir.Join("root"), options);
  ASSERT_TRUE(engine.ok());
  std::vector<OwnedTensor> state = SomeState(7);
  fs->SetIoDelay(absl::Milliseconds(20));
  auto first = (*engine)->SaveAsync(1, Views(state));  // grows the pool unpinned
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ((*engine)->stats().saves_staged_unpinned, 1u);
  auto second = (*engine)->SaveAsync(2, Views(state));  // the pool is held by step 1
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_TRUE((*second)->skipped()) << "the save waited for the first save's writes";
  EXPECT_FALSE((*first)->Done()) << "the first save finished before the second was asked for";
  fs->SetIoDelay(absl::ZeroDuration());
  ASSERT_TRUE(testing::WaitOrDie(**first, absl::Seconds(60), "first save").ok());
  ASSERT_TRUE((*engine)->Close().ok());
  EXPECT_EQ(*ListSteps(dir.Join("root")), (std::vector<int64_t>{1}));
  ExpectCheckpointEquals(dir.Join("root"), 1, state);
}

TEST(AsyncEngineTest, StagingReserveBytesPinsThePoolBeforeTheFirstSave) {
  std::vector<OwnedTensor> state = SomeState(6, 600000);
  uint64_t bytes = 0;
  for (const OwnedTensor& t : state) bytes += t.bytes.size();
  const std::string pinned = ReservedStagingMemory(state);
  ScratchDir dir;
  EngineOptions options = SmallChunks();
  options.staging_reserve_bytes = bytes + 64 * options.io.chunk_bytes;  // padding and alignment
  auto engine = Engine::Open(dir.Join("root"), options);
  ASSERT_TRUE(engine.ok());
  // Right after Open: the save waits for the reservation if it is not done,
  // and stages into pinned memory.
  auto first = (*engine)->SaveAsync(1, Views(state));
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(testing::WaitOrDie(**first, absl::Seconds(60), "first save").ok());
  EXPECT_EQ((*first)->stats().staging_memory, pinned);
  EXPECT_EQ((*engine)->stats().saves_staged_unpinned, 0u);
  EXPECT_GE((*engine)->stats().staging_bytes, bytes);
  ASSERT_TRUE((*engine)->Close().ok());
  ExpectCheckpointEquals(dir.Join("root"), 1, state);
}

TEST(AsyncEngineTest, DestructorWaitsForInFlightSaves) {
  ScratchDir dir;
  std::vector<OwnedTensor> state = SomeState(3);
  {
    auto engine = Engine::Open(dir.Join("root"), SmallChunks());
    ASSERT_TRUE(engine.ok());
    for (int64_t step = 1; step <= 3; ++step) ASSERT_TRUE((*engine)->SaveAsync(step, Views(state)).ok());
  }
  for (int64_t step = 1; step <= 3; ++step) ExpectCheckpointEquals(dir.Join("root"), step, state);
}

TEST(AsyncEngineTest, SameStepTwiceInFlightIsRejected) {
  ScratchDir dir;
  auto fs = std::make_shared<FaultInjectionFileSystem>(PosixFileSystem());
  EngineOptions options = SmallChunks();
  options.fs = fs;
  auto engine = Engine::Open(dir.Join("root"), options);
  ASSERT_TRUE(engine.ok());
  fs->SetIoDelay(absl::Milliseconds(5));
  std::vector<OwnedTensor> state = SomeState(1);
  auto first = (*engine)->SaveAsync(7, Views(state));
  ASSERT_TRUE(first.ok());
  auto again = (*engine)->SaveAsync(7, Views(state));
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE((*first)->Wait().ok());
}

TEST(AsyncEngineTest, WatchdogReportsAStalledSave) {
  ScratchDir dir;
  auto fs = std::make_shared<FaultInjectionFileSystem>(PosixFileSystem());
  EngineOptions options = SmallChunks();
  options.fs = fs;
  options.watchdog_timeout = absl::Milliseconds(50);
  std::atomic<int64_t> stalled_step{-1};
  options.on_stall = [&](int64_t step, absl::Duration) { stalled_step = step; };
  auto engine = Engine::Open(dir.Join("root"), options);
  ASSERT_TRUE(engine.ok());
  fs->SetIoDelay(absl::Milliseconds(300));  // one write takes longer than the timeout
  std::vector<OwnedTensor> state = {RandomTensor("w", DType::kFloat32, {10}, 1)};
  auto handle = (*engine)->SaveAsync(9, Views(state));
  ASSERT_TRUE(handle.ok());
  ASSERT_TRUE((*handle)->Wait().ok());
  EXPECT_EQ(stalled_step.load(), 9);
  EXPECT_GE((*engine)->stats().watchdog_stalls, 1u);
}

TEST(AsyncEngineTest, MetricsAreLoggedAsJsonLinesAndPrometheus) {
  ScratchDir dir;
  EngineOptions options = SmallChunks();
  options.metrics_jsonl_path = dir.Join("metrics.jsonl");
  options.prometheus_textfile_path = dir.Join("ckpt.prom");
  auto engine = Engine::Open(dir.Join("root"), options);
  ASSERT_TRUE(engine.ok());
  std::vector<OwnedTensor> state = SomeState(1);
  ASSERT_TRUE((*engine)->Save(1, Views(state)).ok());
  ASSERT_TRUE((*engine)->Save(2, Views(state)).ok());
  ASSERT_TRUE((*engine)->Close().ok());
  std::ifstream jsonl(dir.Join("metrics.jsonl"));
  std::string line;
  int lines = 0;
  while (std::getline(jsonl, line)) {
    auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j["outcome"], "committed");
    EXPECT_EQ(j["step"], lines + 1);
    EXPECT_GT(j["file_bytes"].get<uint64_t>(), 0u);
    EXPECT_TRUE(j.contains("blocked_s") && j.contains("persist_gbps") && j.contains("backend"));
    ++lines;
  }
  EXPECT_EQ(lines, 2);
  std::stringstream prom;
  prom << std::ifstream(dir.Join("ckpt.prom")).rdbuf();
  EXPECT_NE(prom.str().find("# TYPE ckpt_saves_committed_total counter"), std::string::npos);
  EXPECT_NE(prom.str().find("ckpt_saves_committed_total{root=\"" + dir.Join("root") + "\"} 2"),
            std::string::npos)
      << prom.str();
}

TEST(AsyncEngineTest, ZstdCompressedShardsRoundTrip) {
  ScratchDir dir;
  EngineOptions options = SmallChunks();
  options.compression_level = 3;
  auto engine = Engine::Open(dir.Join("root"), options);
  ASSERT_TRUE(engine.ok());
  std::vector<OwnedTensor> state = SomeState(1, 100000);
  // Compressible tensors (runs), an empty one, and awkward sizes.
  OwnedTensor zeros{"zeros.w", DType::kFloat32, {300000}, std::vector<uint8_t>(1200000, 0)};
  state.push_back(zeros);
  state.push_back(RandomTensor("odd.empty", DType::kInt64, {0}, 1));
  state.push_back(RandomTensor("odd.b4097", DType::kUInt8, {4097}, 2));
  auto stats = (*engine)->Save(1, Views(state));
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_LT(stats->file_bytes, stats->tensor_bytes);
  ExpectCheckpointEquals(dir.Join("root"), 1, state);
  auto reader = Reader::Open(dir.Join("root"), ReaderOptions{});
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ((*reader)->Find("zeros.w")->encoding, RecordEncoding::kZstd);
  EXPECT_LT((*reader)->Find("zeros.w")->stored_bytes, 10000u);
}

TEST(AsyncEngineTest, CorruptCompressedRecordIsDataLoss) {
  ScratchDir dir;
  EngineOptions options = SmallChunks();
  options.compression_level = 1;
  auto engine = Engine::Open(dir.Join("root"), options);
  ASSERT_TRUE(engine.ok());
  std::vector<OwnedTensor> state = {
      OwnedTensor{"m.w", DType::kUInt8, {100000}, std::vector<uint8_t>(100000, 7)}};
  ASSERT_TRUE((*engine)->Save(1, Views(state)).ok());
  auto reader = Reader::Open(dir.Join("root"), ReaderOptions{});
  ASSERT_TRUE(reader.ok());
  const TensorInfo* info = (*reader)->Find("m.w");
  {
    std::fstream f((*reader)->dir() + "/" + info->shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(info->offset + info->stored_bytes / 2));
    f.put('\x55');
  }
  auto t = (*reader)->Read("m.w");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kDataLoss) << t.status();
  EXPECT_NE(std::string(t.status().message()).find("m.w"), std::string::npos);
  EXPECT_EQ((*reader)->Verify().code(), absl::StatusCode::kDataLoss);
}

// The step a file-system call made by a save is about, from the names in
// it (".tmp-step-<20 digits>-<nonce>", "step-<20 digits>"); -1 for none.
int64_t StepNamedIn(absl::string_view call) {
  const size_t at = call.find("step-");
  if (at == absl::string_view::npos || call.size() < at + 5 + 20) return -1;
  int64_t step = 0;
  for (char c : call.substr(at + 5, 20)) {
    if (c < '0' || c > '9') return -1;
    step = step * 10 + (c - '0');
  }
  return step;
}

// Saves from several threads at once are written one at a time and commit in
// the order they were started (engine.h): read from the file-system calls the
// persister makes, with every save queued before the first one may write.
// Save X was started before save Y at least when X's `SaveAsync` returned
// before Y's was called; concurrent calls may go either way.
TEST(AsyncEngineTest, ConcurrentSaversAreSerialized) {
  ScratchDir dir;
  auto fs = std::make_shared<FaultInjectionFileSystem>(PosixFileSystem());
  EngineOptions options = SmallChunks();
  options.fs = fs;
  options.staging_bytes = 32 << 20;  // every save at once (about 1 MiB each): none waits for memory
  auto engine = Engine::Open(dir.Join("root"), options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  constexpr int kThreads = 4;
  constexpr int kSavesEach = 3;
  std::vector<std::vector<OwnedTensor>> states;
  for (int i = 0; i < kThreads; ++i) states.push_back(SomeState(i + 1));
  struct Call {
    int64_t step = -1;
    int called = 0;    // ticks of `clock`
    int returned = 0;
    std::shared_ptr<SaveHandle> handle;
  };
  std::vector<Call> calls(kThreads * kSavesEach);
  std::atomic<int> clock{0};
  std::atomic<int> queued{0};
  fs->RecordCalls(true);
  fs->HoldIo(true);  // the first save's writes wait until every save is queued behind it
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      for (int k = 0; k < kSavesEach; ++k) {
        Call& call = calls[i * kSavesEach + k];
        call.step = i * 10 + k;
        call.called = clock++;
        auto h = (*engine)->SaveAsync(call.step, Views(states[i]));
        call.returned = clock++;
        EXPECT_TRUE(h.ok()) << h.status();
        if (h.ok()) call.handle = *h;
        ++queued;
      }
    });
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (queued < kThreads * kSavesEach && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  const int queued_while_held = queued;
  fs->HoldIo(false);
  testing::RunOrDie([&] { for (auto& t : threads) t.join(); }, absl::Seconds(60),
                    "the saving threads");
  EXPECT_EQ(queued_while_held, kThreads * kSavesEach) << "SaveAsync blocked behind a held write";
  for (const Call& call : calls) {
    ASSERT_NE(call.handle, nullptr) << "step " << call.step;
    const absl::Status s = testing::WaitOrDie(*call.handle, absl::Seconds(60), "a concurrent save");
    EXPECT_TRUE(s.ok()) << "step " << call.step << ": " << s;
  }
  const std::vector<std::string> log = fs->recorded_calls();

  // Commits: each save's directory renamed into place, then LATEST replaced,
  // before the next save's first call. Runs: the steps the persister's calls
  // name, in order, repeats collapsed. One run per save, in commit order,
  // means no two saves' calls interleave.
  const std::string latest = absl::StrCat(" to ", dir.Join("root"), "/LATEST");
  std::vector<int64_t> commits;
  std::vector<int64_t> runs;
  bool latest_replaced = true;  // since the last commit
  for (const std::string& call : log) {
    if (absl::StartsWith(call, "stat ")) continue;  // SaveAsync's check, on the callers' threads
    if (absl::StartsWith(call, "rename ") && absl::EndsWith(call, latest)) {
      EXPECT_FALSE(latest_replaced) << call << ": LATEST replaced twice for one commit";
      latest_replaced = true;
      continue;
    }
    const int64_t step = StepNamedIn(call);
    if (step < 0) continue;
    if (runs.empty() || runs.back() != step) {
      EXPECT_TRUE(latest_replaced) << call << ": began before the previous commit replaced LATEST";
      runs.push_back(step);
    }
    if (absl::StartsWith(call, "rename ") &&
        absl::EndsWith(call, absl::StrCat(" to ", dir.Join("root"), "/", StepDirName(step)))) {
      commits.push_back(step);
      latest_replaced = false;
    }
  }
  EXPECT_TRUE(latest_replaced) << "the last commit did not replace LATEST";
  ASSERT_EQ(commits.size(), calls.size());
  EXPECT_EQ(runs, commits) << "saves interleaved";
  std::map<int64_t, size_t> position;
  for (size_t i = 0; i < commits.size(); ++i) position[commits[i]] = i;
  int ordered_pairs = 0;
  int out_of_order = 0;
  std::string first;
  for (const Call& x : calls) {
    for (const Call& y : calls) {
      if (x.returned >= y.called) continue;
      ++ordered_pairs;
      if (position[x.step] < position[y.step]) continue;
      if (out_of_order++ == 0) {
        first = absl::StrCat("step ", x.step, " was started before step ", y.step,
                             " but committed after it");
      }
    }
  }
  EXPECT_EQ(out_of_order, 0) << first << " (commit order: " << absl::StrJoin(commits, ", ") << ")";
  EXPECT_GE(ordered_pairs, kThreads * kSavesEach * (kSavesEach - 1) / 2);  // each thread's own
  std::ifstream latest_file(dir.Join("root") + "/LATEST");
  std::string latest_name;
  std::getline(latest_file, latest_name);
  EXPECT_EQ(latest_name, StepDirName(commits.back()));
  for (int i = 0; i < kThreads; ++i) {
    for (int k = 0; k < kSavesEach; ++k) {
      ExpectCheckpointEquals(dir.Join("root"), i * 10 + k, states[i]);
    }
  }
}

}  // namespace
}  // namespace ckpt
