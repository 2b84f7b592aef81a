// The CUDA stager on a real GPU: device tensors are copied after the work
// the caller queued on its stream before `SaveAsync`, and before the work it
// queues after `SaveAsync` returns (eager) or after `WaitStaged` (lazy).
// Every test skips when the CUDA runtime sees no device.
//
// Each test first fills device memory with a stale pattern, then queues on
// the caller's stream a long run of memsets followed by the H2D copy of the
// values the checkpoint must hold, and calls `SaveAsync` without
// synchronizing: a copy not ordered after the stream reads stale bytes.
// After staging it queues a memset that overwrites the tensors: a copy not
// finished by then reads junk.
#include "gtest/gtest.h"

#ifdef CKPT_HAVE_CUDA

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <iostream>
#include <memory>

#include "ckpt/engine.h"
#include "ckpt/reader.h"
#include "test_util.h"

namespace ckpt {
namespace {

using testing::OwnedTensor;
using testing::RandomTensor;
using testing::ScratchDir;

#define ASSERT_CUDA(expr)                                                          \
  do {                                                                             \
    cudaError_t err_ = (expr);                                                     \
    ASSERT_EQ(err_, cudaSuccess) << #expr << ": " << cudaGetErrorString(err_);     \
  } while (false)

constexpr uint8_t kStale = 0x11;      // in device memory before the save's stream work
constexpr uint8_t kOverwrite = 0xA5;  // queued after staging
constexpr size_t kScratchBytes = size_t{256} << 20;
constexpr int kSlowRounds = 48;  // ~12 GB of memset queued ahead of the values

// The number of visible devices, or 0 (with the reason in `why`).
int DeviceCount(std::string* why) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    *why = std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
    return 0;
  }
  if (count == 0) *why = "cudaGetDeviceCount reports 0 devices";
  return count;
}

// One tensor in device memory, with a pinned host copy of the values the
// checkpoint must hold.
class DeviceTensor {
 public:
  explicit DeviceTensor(OwnedTensor want) : want_(std::move(want)) {}
  ~DeviceTensor() {
    if (dev_ != nullptr) (void)cudaFree(dev_);
    if (pinned_ != nullptr) (void)cudaFreeHost(pinned_);
  }
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;

  // Allocates on `device` and fills with `kStale`, synchronously.
  void Allocate(int device) {
    device_ = device;
    const size_t n = std::max<size_t>(want_.bytes.size(), 1);
    ASSERT_CUDA(cudaSetDevice(device));
    ASSERT_CUDA(cudaMalloc(&dev_, n));
    ASSERT_CUDA(cudaMallocHost(&pinned_, n));
    std::memcpy(pinned_, want_.bytes.data(), want_.bytes.size());
    ASSERT_CUDA(cudaMemset(dev_, kStale, n));
    ASSERT_CUDA(cudaDeviceSynchronize());  // test set-up only
  }
  // Queues the upload of the wanted values on `stream`.
  void QueueUpload(cudaStream_t stream) {
    if (want_.bytes.empty()) return;
    ASSERT_CUDA(cudaMemcpyAsync(dev_, pinned_, want_.bytes.size(), cudaMemcpyHostToDevice, stream));
  }
  void QueueOverwrite(cudaStream_t stream) {
    if (want_.bytes.empty()) return;
    ASSERT_CUDA(cudaMemsetAsync(dev_, kOverwrite, want_.bytes.size(), stream));
  }
  TensorView view(cudaStream_t stream) const {
    TensorView v = want_.view();
    v.data = want_.bytes.empty() ? nullptr : dev_;
    v.device = TensorView::Device::kCuda;
    v.device_index = device_;
    v.stream = stream;
    return v;
  }
  const OwnedTensor& want() const { return want_; }
  // The device bytes now (after the caller's stream is synchronized).
  std::vector<uint8_t> DeviceBytes() const {
    std::vector<uint8_t> out(want_.bytes.size());
    if (!out.empty()) (void)cudaMemcpy(out.data(), dev_, out.size(), cudaMemcpyDeviceToHost);
    return out;
  }

 private:
  OwnedTensor want_;
  int device_ = 0;
  void* dev_ = nullptr;
  void* pinned_ = nullptr;
};

// Several dtypes and sizes: empty, scalar, odd, more than one 1 MiB chunk.
std::vector<std::unique_ptr<DeviceTensor>> MakeTensors(uint64_t seed) {
  std::vector<OwnedTensor> want = {
      RandomTensor("model.embed.weight", DType::kBFloat16, {1024, 1027}, seed + 1),  // ~2 MiB
      RandomTensor("model.empty", DType::kFloat32, {0}, seed + 2),
      RandomTensor("model.scale", DType::kFloat32, {}, seed + 3),
      RandomTensor("model.fc.weight", DType::kFloat32, {(3 << 18) + 5}, seed + 4),  // 3 MiB + 20
      RandomTensor("model.fc.index", DType::kInt64, {4097}, seed + 5),
      RandomTensor("model.mask", DType::kUInt8, {999}, seed + 6),
      RandomTensor("model.norm.weight", DType::kFloat16, {4096}, seed + 7),
  };
  std::vector<std::unique_ptr<DeviceTensor>> out;
  for (OwnedTensor& t : want) out.push_back(std::make_unique<DeviceTensor>(std::move(t)));
  return out;
}

class CudaStagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    devices_ = DeviceCount(&why);
    if (devices_ == 0) GTEST_SKIP() << "no CUDA device (" << why << "): GPU staging not tested";
    ASSERT_CUDA(cudaSetDevice(0));
    ASSERT_CUDA(cudaMalloc(&scratch_, kScratchBytes));
  }
  void TearDown() override {
    if (scratch_ != nullptr) (void)cudaFree(scratch_);
  }

  // Queues ~12 GB of memsets on `stream`: milliseconds of work that the
  // save's copies must wait for.
  void QueueSlowWork(cudaStream_t stream) {
    for (int i = 0; i < kSlowRounds; ++i) {
      ASSERT_CUDA(cudaMemsetAsync(scratch_, i, kScratchBytes, stream));
    }
  }

  // Prepares `tensors` on device 0 and queues slow work then their upload on
  // `stream`, without synchronizing.
  void QueueValues(std::vector<std::unique_ptr<DeviceTensor>>& tensors, cudaStream_t stream) {
    for (auto& t : tensors) ASSERT_NO_FATAL_FAILURE(t->Allocate(0));
    ASSERT_NO_FATAL_FAILURE(QueueSlowWork(stream));
    for (auto& t : tensors) ASSERT_NO_FATAL_FAILURE(t->QueueUpload(stream));
  }

  void ExpectCheckpointHolds(int64_t step, const std::vector<std::unique_ptr<DeviceTensor>>& tensors) {
    ReaderOptions options;
    options.step = step;
    auto reader = Reader::Open(root_, options);
    ASSERT_TRUE(reader.ok()) << reader.status();
    ASSERT_TRUE((*reader)->Verify().ok());
    for (const auto& t : tensors) {
      const OwnedTensor& want = t->want();
      auto got = (*reader)->Read(want.name);
      ASSERT_TRUE(got.ok()) << got.status();
      ASSERT_EQ(got->nbytes(), want.bytes.size());
      EXPECT_EQ(0, std::memcmp(got->data(), want.bytes.data(), want.bytes.size()))
          << want.name << ": the checkpoint does not hold the values queued before SaveAsync";
    }
  }

  // The overwrite queued after staging did run (so the test tested something).
  static void ExpectOverwritten(const std::vector<std::unique_ptr<DeviceTensor>>& tensors) {
    for (const auto& t : tensors) {
      for (uint8_t b : t->DeviceBytes()) {
        ASSERT_EQ(b, kOverwrite) << t->want().name;
      }
    }
  }

  static std::vector<TensorView> Views(const std::vector<std::unique_ptr<DeviceTensor>>& tensors,
                                       cudaStream_t stream) {
    std::vector<TensorView> views;
    for (const auto& t : tensors) views.push_back(t->view(stream));
    return views;
  }

  int devices_ = 0;
  void* scratch_ = nullptr;
  ScratchDir dir_;
  std::string root_ = dir_.Join("root");
};

TEST_F(CudaStagerTest, EagerSaveFromASideStreamHoldsValuesBeforeTheOverwrite) {
  cudaStream_t stream = nullptr;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto engine = Engine::Open(root_, EngineOptions{});
  ASSERT_TRUE(engine.ok()) << engine.status();
  for (int64_t step = 1; step <= 2; ++step) {  // the second save reuses the copier
    auto tensors = MakeTensors(step * 10);
    ASSERT_NO_FATAL_FAILURE(QueueValues(tensors, stream));
    auto handle = (*engine)->SaveAsync(step, Views(tensors, stream));
    ASSERT_TRUE(handle.ok()) << handle.status();
    for (auto& t : tensors) ASSERT_NO_FATAL_FAILURE(t->QueueOverwrite(stream));
    int current = -1;
    ASSERT_CUDA(cudaGetDevice(&current));
    EXPECT_EQ(current, 0);
    ASSERT_TRUE((*handle)->Wait().ok());
    ASSERT_CUDA(cudaStreamSynchronize(stream));
    ExpectCheckpointHolds(step, tensors);
    ExpectOverwritten(tensors);
  }
  EXPECT_EQ((*engine)->stats().staging_memory, "cudaHostRegister")
      << "staging memory is not page-locked by CUDA: copies run at pageable speed";
  ASSERT_TRUE((*engine)->Close().ok());
  ASSERT_CUDA(cudaStreamDestroy(stream));
}

TEST_F(CudaStagerTest, LazySaveHoldsValuesWhenOverwrittenAfterWaitStaged) {
  cudaStream_t stream = nullptr;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  EngineOptions options;
  options.lazy_staging = true;
  auto engine = Engine::Open(root_, options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  for (int64_t step = 1; step <= 2; ++step) {
    auto tensors = MakeTensors(step * 20);
    ASSERT_NO_FATAL_FAILURE(QueueValues(tensors, stream));
    auto handle = (*engine)->SaveAsync(step, Views(tensors, stream));
    ASSERT_TRUE(handle.ok()) << handle.status();
    ASSERT_TRUE((*handle)->WaitStaged().ok());
    for (auto& t : tensors) ASSERT_NO_FATAL_FAILURE(t->QueueOverwrite(stream));
    ASSERT_TRUE((*handle)->Wait().ok());
    ASSERT_CUDA(cudaStreamSynchronize(stream));
    ExpectCheckpointHolds(step, tensors);
    ExpectOverwritten(tensors);
  }
  ASSERT_CUDA(cudaStreamDestroy(stream));
}

TEST_F(CudaStagerTest, EagerSaveFromTheLegacyDefaultStream) {
  auto engine = Engine::Open(root_, EngineOptions{});
  ASSERT_TRUE(engine.ok()) << engine.status();
  auto tensors = MakeTensors(30);
  ASSERT_NO_FATAL_FAILURE(QueueValues(tensors, nullptr));
  auto handle = (*engine)->SaveAsync(1, Views(tensors, nullptr));
  ASSERT_TRUE(handle.ok()) << handle.status();
  for (auto& t : tensors) ASSERT_NO_FATAL_FAILURE(t->QueueOverwrite(nullptr));
  ASSERT_TRUE((*handle)->Wait().ok());
  ASSERT_CUDA(cudaStreamSynchronize(nullptr));
  ExpectCheckpointHolds(1, tensors);
  ExpectOverwritten(tensors);
}

TEST_F(CudaStagerTest, OneSaveWithTensorsOnTwoStreamsAndHostTensors) {
  cudaStream_t a = nullptr, b = nullptr;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  ASSERT_CUDA(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  auto engine = Engine::Open(root_, EngineOptions{});
  ASSERT_TRUE(engine.ok()) << engine.status();
  auto tensors = MakeTensors(40);
  for (auto& t : tensors) ASSERT_NO_FATAL_FAILURE(t->Allocate(0));
  ASSERT_NO_FATAL_FAILURE(QueueSlowWork(a));
  std::vector<TensorView> views;
  for (size_t i = 0; i < tensors.size(); ++i) {
    cudaStream_t s = i % 2 == 0 ? a : b;
    ASSERT_NO_FATAL_FAILURE(tensors[i]->QueueUpload(s));
    views.push_back(tensors[i]->view(s));
  }
  OwnedTensor host = RandomTensor("host.extra", DType::kFloat32, {100000}, 41);
  views.push_back(host.view());
  auto handle = (*engine)->SaveAsync(1, views);
  ASSERT_TRUE(handle.ok()) << handle.status();
  for (size_t i = 0; i < tensors.size(); ++i) {
    ASSERT_NO_FATAL_FAILURE(tensors[i]->QueueOverwrite(i % 2 == 0 ? a : b));
  }
  ASSERT_TRUE((*handle)->Wait().ok());
  ASSERT_CUDA(cudaStreamSynchronize(a));
  ASSERT_CUDA(cudaStreamSynchronize(b));
  ExpectCheckpointHolds(1, tensors);
  ExpectOverwritten(tensors);
  ASSERT_CUDA(cudaStreamDestroy(a));
  ASSERT_CUDA(cudaStreamDestroy(b));
}

TEST_F(CudaStagerTest, TensorOnAnotherDeviceKeepsTheCallersCurrentDevice) {
  if (devices_ < 2) GTEST_SKIP() << "needs 2 CUDA devices, " << devices_ << " visible";
  auto engine = Engine::Open(root_, EngineOptions{});
  ASSERT_TRUE(engine.ok()) << engine.status();
  auto tensors = MakeTensors(50);
  for (auto& t : tensors) ASSERT_NO_FATAL_FAILURE(t->Allocate(1));
  ASSERT_CUDA(cudaSetDevice(1));
  for (auto& t : tensors) ASSERT_NO_FATAL_FAILURE(t->QueueUpload(nullptr));
  ASSERT_CUDA(cudaSetDevice(0));
  auto handle = (*engine)->SaveAsync(1, Views(tensors, nullptr));  // device 1's default stream
  ASSERT_TRUE(handle.ok()) << handle.status();
  int current = -1;
  ASSERT_CUDA(cudaGetDevice(&current));
  EXPECT_EQ(current, 0);
  ASSERT_TRUE((*handle)->Wait().ok());
  ExpectCheckpointHolds(1, tensors);
}

// The other side: a CUDA build on a machine without a device (or driver)
// refuses CUDA tensors cleanly, at `SaveAsync`.
TEST(CudaStagerNoDeviceTest, CudaTensorFailsAtSaveAsyncWithoutADevice) {
  std::string why;
  if (DeviceCount(&why) > 0) GTEST_SKIP() << "a CUDA device is present";
  ScratchDir dir;
  auto engine = Engine::Open(dir.Join("root"), EngineOptions{});
  ASSERT_TRUE(engine.ok()) << engine.status();
  OwnedTensor t = RandomTensor("w", DType::kFloat32, {16}, 1);
  TensorView v = t.view();
  v.device = TensorView::Device::kCuda;
  v.data = reinterpret_cast<void*>(0x7f0000000000);  // never dereferenced
  std::vector<TensorView> views = {v};
  auto handle = (*engine)->SaveAsync(1, views);
  ASSERT_FALSE(handle.ok());
  EXPECT_EQ(handle.status().code(), absl::StatusCode::kFailedPrecondition) << handle.status();
  EXPECT_NE(handle.status().message().find("\"w\""), absl::string_view::npos) << handle.status();
  EXPECT_NE(handle.status().message().find("cudaGetDeviceCount"), absl::string_view::npos)
      << handle.status();
  EXPECT_NE((*engine)->stats().staging_memory, "cudaHostRegister");
  std::cout << "SaveAsync refused the CUDA tensor: " << handle.status() << "\n";
}

}  // namespace
}  // namespace ckpt

#else  // !CKPT_HAVE_CUDA

TEST(CudaStagerTest, BuiltWithoutCuda) {
  GTEST_SKIP() << "built without CUDA (CKPT_WITH_CUDA=OFF or no toolkit): GPU staging not tested";
}

#endif  // CKPT_HAVE_CUDA
