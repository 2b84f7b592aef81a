// The device staging path without a GPU: a fake `DeviceCopier` whose copies
// land only when waited for. Host memory stands in for device memory; the
// stager must not read a staging chunk before its token was awaited, so every
// queued copy first fills its destination with junk.
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <span>
#include <thread>

#include "ckpt/engine.h"
#include "ckpt/reader.h"
#include "gtest/gtest.h"
#include "staging/device_copier.h"
#include "test_util.h"

namespace ckpt {
namespace {

using internal::DeviceCopier;
using testing::OwnedTensor;
using testing::RandomTensor;
using testing::ExpectCheckpointEquals;
using testing::ScratchDir;
using testing::SmallChunks;

// What the fake does, and what it saw. The factory is a plain function
// pointer, so tests configure the fake through this global.
struct FakeGpu {
  int fail_copy_at = -1;   // the CopyAsync call (0-based) that fails
  int fail_wait_at = -1;   // the WaitFor call (0-based) that fails
  int copies_queued = 0;
  int copies_landed = 0;
  int copy_calls = 0;
  int wait_calls = 0;
  int copiers_made = 0;
  std::vector<std::pair<int, void*>> callers;  // distinct (device, stream) seen
  int marks_made = 0;
  // Per copy: how much caller-stream work it is ordered after.
  std::vector<int> copy_ordered_after;
};
FakeGpu gpu;
// Work items the caller has queued on its stream (bumped by tests, read by
// `MarkCallerStreams` on the caller's thread and by copies on the stager's).
std::atomic<int> stream_work{0};
// While false, `WaitFor` blocks: holds a lazy stager inside a save.
std::atomic<bool> waits_open{true};

constexpr char kCopyFault[] = "fake copy engine: queue full";
constexpr char kWaitFault[] = "fake copy engine: uncorrectable ECC error";
constexpr uint8_t kJunk = 0xEE;

// The stream position a save was marked at.
struct FakeMark final : internal::CallerStreamMark {
  int work = 0;
};

class QueuedCopier final : public DeviceCopier {
 public:
  absl::StatusOr<std::unique_ptr<internal::CallerStreamMark>> MarkCallerStreams(
      std::span<const internal::DeviceStream> streams) override {
    ++gpu.marks_made;
    auto mark = std::make_unique<FakeMark>();
    mark->work = stream_work.load();
    return std::unique_ptr<internal::CallerStreamMark>(std::move(mark));
  }

  absl::Status CopyAsync(void* dst, const void* src, size_t n, int device, void* caller_stream,
                         const internal::CallerStreamMark* mark) override {
    if (gpu.copy_calls++ == gpu.fail_copy_at) return absl::InternalError(kCopyFault);
    gpu.copy_ordered_after.push_back(mark != nullptr ? static_cast<const FakeMark*>(mark)->work
                                                     : stream_work.load());
    std::pair<int, void*> caller{device, caller_stream};
    if (std::find(gpu.callers.begin(), gpu.callers.end(), caller) == gpu.callers.end()) {
      gpu.callers.push_back(caller);
    }
    std::memset(dst, kJunk, n);  // undefined until the copy lands
    queue_.push_back(Copy{dst, src, n, 0});
    ++gpu.copies_queued;
    return absl::OkStatus();
  }

  absl::StatusOr<uint64_t> Record() override {
    ++last_token_;
    for (Copy& c : queue_) {
      if (c.token == 0) c.token = last_token_;
    }
    return last_token_;
  }

  absl::Status WaitFor(uint64_t token) override {
    while (!waits_open.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (gpu.wait_calls++ == gpu.fail_wait_at) return absl::DataLossError(kWaitFault);
    EXPECT_LE(token, last_token_);
    while (!queue_.empty() && queue_.front().token != 0 && queue_.front().token <= token) {
      const Copy& c = queue_.front();
      std::memcpy(c.dst, c.src, c.n);
      ++gpu.copies_landed;
      queue_.pop_front();
    }
    return absl::OkStatus();
  }

 private:
  struct Copy {
    void* dst;
    const void* src;
    size_t n;
    uint64_t token;  // 0 until a `Record()` covers it
  };
  std::deque<Copy> queue_;
  uint64_t last_token_ = 0;
};

absl::StatusOr<std::unique_ptr<DeviceCopier>> MakeQueuedCopier() {
  ++gpu.copiers_made;
  return std::unique_ptr<DeviceCopier>(new QueuedCopier());
}

absl::StatusOr<std::unique_ptr<DeviceCopier>> MakeNoCopier() {
  return absl::UnavailableError("cudaGetDeviceCount: no CUDA-capable device is detected");
}

void* const kStream = reinterpret_cast<void*>(0x5eed);

// `t` as a view of "device" memory on device 1, stream `kStream`.
TensorView OnDevice(const OwnedTensor& t) {
  TensorView v = t.view();
  v.device = TensorView::Device::kCuda;
  v.device_index = 1;
  v.stream = kStream;
  return v;
}

std::vector<TensorView> AllOnDevice(const std::vector<OwnedTensor>& tensors) {
  std::vector<TensorView> views;
  for (const OwnedTensor& t : tensors) views.push_back(OnDevice(t));
  return views;
}



void ExpectRootEmpty(const std::string& root) {
  auto names = PosixFileSystem()->ListDir(root);
  ASSERT_TRUE(names.ok()) << names.status();
  for (const std::string& name : *names) {
    if (!testing::IsRootLockFile(name)) ADD_FAILURE() << "left behind: " << name;
  }
}

class DeviceStagingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    gpu = FakeGpu{};
    stream_work = 0;
    waits_open = true;
    internal::SetDeviceCopierFactoryForTesting(&MakeQueuedCopier);
  }
  void TearDown() override { internal::SetDeviceCopierFactoryForTesting(nullptr); }

  ScratchDir dir_;
  std::string root_ = dir_.Join("root");
};

// Several dtypes and sizes: empty, scalar, odd lengths, a few chunks.
std::vector<OwnedTensor> VariedState(uint64_t seed) {
  return {
      RandomTensor("model.embed.weight", DType::kBFloat16, {300, 129}, seed + 1),
      RandomTensor("model.empty", DType::kFloat32, {0, 7}, seed + 2),
      RandomTensor("model.scale", DType::kFloat64, {}, seed + 3),
      RandomTensor("model.mask", DType::kBool, {1001}, seed + 4),
      RandomTensor("model.fc.weight", DType::kFloat32, {257, 311}, seed + 5),
      RandomTensor("model.fc.index", DType::kInt64, {12345}, seed + 6),
      RandomTensor("model.fc.bytes", DType::kUInt8, {3}, seed + 7),
  };
}

TEST_F(DeviceStagingTest, DeviceTensorsRestoreExactlyWithRightHashes) {
  std::vector<OwnedTensor> state = VariedState(10);
  auto engine = Engine::Open(root_, SmallChunks());
  ASSERT_TRUE(engine.ok()) << engine.status();
  auto stats = (*engine)->Save(1, AllOnDevice(state));
  ASSERT_TRUE(stats.ok()) << stats.status();
  ExpectCheckpointEquals(root_, 1, state);
  EXPECT_GT(gpu.copies_queued, 0);
  EXPECT_EQ(gpu.copies_landed, gpu.copies_queued);
  EXPECT_EQ(gpu.copiers_made, 1);
  ASSERT_EQ(gpu.callers.size(), 1u);
  EXPECT_EQ(gpu.callers[0], std::make_pair(1, kStream));
}

TEST_F(DeviceStagingTest, MixedHostAndDeviceTensorsInOneSave) {
  std::vector<OwnedTensor> state = VariedState(20);
  std::vector<TensorView> views;
  for (size_t i = 0; i < state.size(); ++i) {
    views.push_back(i % 2 == 0 ? OnDevice(state[i]) : state[i].view());
  }
  auto engine = Engine::Open(root_, SmallChunks());
  ASSERT_TRUE(engine.ok()) << engine.status();
  for (int64_t step = 1; step <= 3; ++step) {
    auto stats = (*engine)->Save(step, views);
    ASSERT_TRUE(stats.ok()) << stats.status();
    ExpectCheckpointEquals(root_, step, state);
  }
  EXPECT_EQ(gpu.copies_landed, gpu.copies_queued);
  EXPECT_EQ(gpu.copiers_made, 1);  // one per engine, reused by every save
}

TEST_F(DeviceStagingTest, DeviceTensorsSpanningManyChunks) {
  // ~4.3 MiB in 64 KiB chunks: dozens of chunks per tensor, and tensors
  // starting and ending mid-chunk.
  std::vector<OwnedTensor> state = {
      RandomTensor("big.a", DType::kFloat32, {(1 << 18) + 3}, 31),
      RandomTensor("big.b", DType::kUInt8, {(3 << 20) + 4097}, 32),
      RandomTensor("big.c", DType::kBFloat16, {77777}, 33),
  };
  EngineOptions options = SmallChunks();
  options.shard_min_bytes = 16 << 20;  // one shard: records share chunks
  auto engine = Engine::Open(root_, options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  ASSERT_TRUE((*engine)->Save(1, AllOnDevice(state)).ok());
  ExpectCheckpointEquals(root_, 1, state);
  EXPECT_GT(gpu.copies_queued, 60);
  EXPECT_EQ(gpu.copies_landed, gpu.copies_queued);
}

TEST_F(DeviceStagingTest, DeviceTensorsStreamThroughAStagingPoolSmallerThanTheSave) {
  std::vector<OwnedTensor> state = {
      RandomTensor("big.a", DType::kFloat32, {1 << 18}, 41),
      RandomTensor("big.b", DType::kFloat32, {1 << 17}, 42),
  };
  EngineOptions options = SmallChunks();
  options.staging_bytes = 3 * options.io.chunk_bytes;  // fewer than the copies kept in flight
  auto engine = Engine::Open(root_, options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  for (int64_t step = 1; step <= 2; ++step) {
    auto stats = (*engine)->Save(step, AllOnDevice(state));
    ASSERT_TRUE(stats.ok()) << stats.status();
    ExpectCheckpointEquals(root_, step, state);
  }
  EXPECT_EQ(gpu.copies_landed, gpu.copies_queued);
}

TEST_F(DeviceStagingTest, LazyModeStagesDeviceTensorsInTheBackground) {
  EngineOptions options = SmallChunks();
  options.lazy_staging = true;
  auto engine = Engine::Open(root_, options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  for (int64_t step = 1; step <= 3; ++step) {
    std::vector<OwnedTensor> state = VariedState(step * 100);
    const std::vector<OwnedTensor> at_save = state;
    auto handle = (*engine)->SaveAsync(step, AllOnDevice(state));
    ASSERT_TRUE(handle.ok()) << handle.status();
    ASSERT_TRUE((*handle)->WaitStaged().ok());
    for (OwnedTensor& t : state) std::memset(t.bytes.data(), 0x5A, t.bytes.size());
    ASSERT_TRUE((*handle)->Wait().ok());
    ExpectCheckpointEquals(root_, step, at_save);
  }
  EXPECT_EQ(gpu.copies_landed, gpu.copies_queued);
}

// A lazily staged save is copied while the caller queues its next forward
// pass: the copies must be ordered after the caller's stream as it was at
// SaveAsync, not as it is when the stager gets to them (that would make the
// copy wait for the compute it is meant to overlap).
TEST_F(DeviceStagingTest, LazyCopiesAreOrderedAfterTheStreamAsItWasAtSaveAsync) {
  EngineOptions options = SmallChunks();
  options.lazy_staging = true;
  auto engine = Engine::Open(root_, options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const std::vector<OwnedTensor> first = VariedState(100);
  const std::vector<OwnedTensor> second = VariedState(200);
  waits_open = false;  // the stager cannot finish the first save yet
  auto h1 = (*engine)->SaveAsync(1, AllOnDevice(first));
  ASSERT_TRUE(h1.ok()) << h1.status();
  stream_work = 1;  // the caller queues a training step
  auto h2 = (*engine)->SaveAsync(2, AllOnDevice(second));
  ASSERT_TRUE(h2.ok()) << h2.status();
  stream_work = 2;  // ... and the next one, before the second save is copied
  waits_open = true;
  ASSERT_TRUE((*h1)->Wait().ok());
  ASSERT_TRUE((*h2)->Wait().ok());
  EXPECT_EQ(gpu.marks_made, 2);
  ASSERT_FALSE(gpu.copy_ordered_after.empty());
  // Save 1's copies come first (saves are staged in order).
  EXPECT_EQ(gpu.copy_ordered_after.front(), 0);
  EXPECT_EQ(gpu.copy_ordered_after.back(), 1);
  for (int after : gpu.copy_ordered_after) EXPECT_LE(after, 1);
  ExpectCheckpointEquals(root_, 1, first);
  ExpectCheckpointEquals(root_, 2, second);
}

TEST_F(DeviceStagingTest, HostOnlySavesNeverMakeACopier) {
  std::vector<OwnedTensor> state = VariedState(50);
  auto engine = Engine::Open(root_, SmallChunks());
  ASSERT_TRUE(engine.ok()) << engine.status();
  ASSERT_TRUE((*engine)->Save(1, testing::Views(state)).ok());
  EXPECT_EQ(gpu.copiers_made, 0);
}

// A copier failure fails the save through its handle, with the copier's
// message; nothing of the save stays on disk and the engine saves again.
void ExpectCopierErrorFailsTheSave(const std::string& root, absl::string_view message) {
  std::vector<OwnedTensor> state = {
      RandomTensor("big.a", DType::kFloat32, {1 << 18}, 61),
      RandomTensor("big.b", DType::kInt32, {100000}, 62),
  };
  auto engine = Engine::Open(root, SmallChunks());
  ASSERT_TRUE(engine.ok()) << engine.status();
  auto handle = (*engine)->SaveAsync(1, AllOnDevice(state));
  ASSERT_TRUE(handle.ok()) << handle.status();
  absl::Status s = (*handle)->Wait();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(message), absl::string_view::npos) << s;
  EXPECT_TRUE((*handle)->Done());
  ExpectRootEmpty(root);
  // Every queued copy was awaited before its chunk went back to the pool.
  EXPECT_EQ(gpu.copies_landed, gpu.copies_queued);

  gpu.fail_copy_at = gpu.fail_wait_at = -1;
  ASSERT_TRUE((*engine)->Save(2, AllOnDevice(state)).ok());
  ExpectCheckpointEquals(root, 2, state);
}

TEST_F(DeviceStagingTest, CopyAsyncErrorFailsTheSaveThroughTheHandle) {
  gpu.fail_copy_at = 12;  // after several chunks were handed to the persister
  ExpectCopierErrorFailsTheSave(root_, kCopyFault);
}

TEST_F(DeviceStagingTest, FirstCopyAsyncErrorFailsTheSaveThroughTheHandle) {
  gpu.fail_copy_at = 0;
  ExpectCopierErrorFailsTheSave(root_, kCopyFault);
}

TEST_F(DeviceStagingTest, WaitForErrorFailsTheSaveThroughTheHandle) {
  gpu.fail_wait_at = 3;
  ExpectCopierErrorFailsTheSave(root_, kWaitFault);
}

TEST_F(DeviceStagingTest, NoCopierFailsAtSaveAsyncNamingTheTensor) {
  internal::SetDeviceCopierFactoryForTesting(&MakeNoCopier);
  std::vector<OwnedTensor> state = VariedState(70);
  std::vector<TensorView> views = testing::Views(state);
  views[4] = OnDevice(state[4]);  // "model.fc.weight"
  auto engine = Engine::Open(root_, SmallChunks());
  ASSERT_TRUE(engine.ok()) << engine.status();
  auto handle = (*engine)->SaveAsync(1, views);
  ASSERT_FALSE(handle.ok());
  EXPECT_EQ(handle.status().code(), absl::StatusCode::kFailedPrecondition) << handle.status();
  EXPECT_NE(handle.status().message().find("\"model.fc.weight\""), absl::string_view::npos)
      << handle.status();
  EXPECT_NE(handle.status().message().find("no CUDA-capable device"), absl::string_view::npos)
      << handle.status();
  ExpectRootEmpty(root_);
  // Host-only saves still work.
  ASSERT_TRUE((*engine)->Save(1, testing::Views(state)).ok());
  ExpectCheckpointEquals(root_, 1, state);
}

}  // namespace
}  // namespace ckpt
