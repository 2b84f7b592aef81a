// Round trips and input validation of Engine::Save and Reader.
#include "ckpt/engine.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <thread>

#include "ckpt/catalog.h"
#include "ckpt/reader.h"

#include "gtest/gtest.h"
#include "test_util.h"

namespace ckpt {
namespace {

using testing::ExpectCheckpointEquals;
using testing::OwnedTensor;
using testing::RandomTensor;
using testing::ScratchDir;
using testing::SmallChunks;
using testing::Views;

struct BackendParam {
  const char* name;
  IoBackend backend;
  DirectIoMode direct;
};

class RoundTripTest : public ::testing::TestWithParam<BackendParam> {
 protected:
  EngineOptions Options() {
    EngineOptions options;
    options.io.backend = GetParam().backend;
    options.io.direct = GetParam().direct;
    options.io.chunk_bytes = 64 << 10;
    options.io.buffer_bytes = 512 << 10;
    options.shard_min_bytes = 16 << 10;
    return options;
  }
  ReaderOptions ReadOptions(std::optional<int64_t> step = std::nullopt) {
    ReaderOptions options;
    options.io = Options().io;
    options.step = step;
    return options;
  }

  void ExpectRestores(const std::string& root, int64_t step, const std::vector<OwnedTensor>& want,
                      const std::string& extras = "{}") {
    auto reader = Reader::Open(root, ReadOptions(step));
    ASSERT_TRUE(reader.ok()) << reader.status();
    EXPECT_EQ((*reader)->step(), step);
    EXPECT_EQ((*reader)->extras_json(), extras);
    ASSERT_EQ((*reader)->tensors().size(), want.size());
    auto all = (*reader)->ReadAll();
    ASSERT_TRUE(all.ok()) << all.status();
    for (size_t i = 0; i < want.size(); ++i) {
      const Tensor& got = (*all)[i];
      EXPECT_EQ(got.name, want[i].name);
      EXPECT_EQ(got.dtype, want[i].dtype);
      EXPECT_EQ(got.shape, want[i].shape);
      ASSERT_EQ(got.nbytes(), want[i].bytes.size()) << got.name;
      if (got.nbytes() > 0) {  // memcmp of null pointers is undefined, even for 0 bytes
        EXPECT_EQ(0, std::memcmp(got.data(), want[i].bytes.data(), got.nbytes())) << got.name;
      }
    }
    // Unaligned caller memory goes through the bounce chunks.
    for (const OwnedTensor& t : want) {
      std::vector<uint8_t> buffer(t.bytes.size() + 1);
      ReadTarget target{t.name, buffer.data() + 1, t.bytes.size()};
      ASSERT_TRUE((*reader)->ReadInto({&target, 1}).ok()) << t.name;
      if (!t.bytes.empty()) {
        EXPECT_EQ(0, std::memcmp(buffer.data() + 1, t.bytes.data(), t.bytes.size())) << t.name;
      }
    }
    EXPECT_TRUE((*reader)->Verify().ok());
  }
};

TEST_P(RoundTripTest, EveryDTypeAndAwkwardSizeIsBitExact) {
  ScratchDir dir;
  auto engine = Engine::Open(dir.Join("root"), Options());
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::vector<OwnedTensor> tensors;
  uint64_t seed = 1;
  for (int d = 0; d < kNumDTypes; ++d) {
    DType dtype = static_cast<DType>(d);
    std::string prefix = "dtypes." + std::string(DTypeName(dtype));
    tensors.push_back(RandomTensor(prefix + ".matrix", dtype, {3, 17}, seed++));
    tensors.push_back(RandomTensor(prefix + ".scalar", dtype, {}, seed++));
    tensors.push_back(RandomTensor(prefix + ".empty", dtype, {0, 5}, seed++));
  }
  for (int64_t n : {1, 4095, 4096, 4097, 65535, 65536, 65537, 300000}) {
    tensors.push_back(RandomTensor("sizes.b" + std::to_string(n), DType::kUInt8, {n}, seed++));
  }
  tensors.push_back(RandomTensor("odd/name/../with slash", DType::kFloat32, {5}, seed++));
  tensors.push_back(RandomTensor("ünïcode.名前", DType::kInt32, {2}, seed++));
  auto stats = (*engine)->Save(7, Views(tensors), R"({"epoch":3,"lr":0.5})");
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_GT(stats->shard_count, 1u);
  ExpectRestores(dir.Join("root"), 7, tensors, R"({"epoch":3,"lr":0.5})");
}

TEST_P(RoundTripTest, TenThousandTinyTensors) {
  ScratchDir dir;
  auto engine = Engine::Open(dir.Join("root"), Options());
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::vector<OwnedTensor> tensors;
  for (int i = 0; i < 10000; ++i) {
    tensors.push_back(RandomTensor("m" + std::to_string(i % 37) + ".t" + std::to_string(i),
                                   DType::kFloat32, {i % 5 + 1}, i));
  }
  ASSERT_TRUE((*engine)->Save(1, Views(tensors)).ok());
  ExpectRestores(dir.Join("root"), 1, tensors);
}

TEST_P(RoundTripTest, LatestIsNewestStep) {
  ScratchDir dir;
  auto engine = Engine::Open(dir.Join("root"), Options());
  ASSERT_TRUE(engine.ok());
  std::vector<OwnedTensor> a = {RandomTensor("w", DType::kFloat32, {100}, 1)};
  std::vector<OwnedTensor> b = {RandomTensor("w", DType::kFloat32, {100}, 2)};
  ASSERT_TRUE((*engine)->Save(10, Views(a)).ok());
  ASSERT_TRUE((*engine)->Save(20, Views(b)).ok());
  auto reader = Reader::Open(dir.Join("root"), ReadOptions());
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ((*reader)->step(), 20);
  auto steps = ListSteps(dir.Join("root"));
  ASSERT_TRUE(steps.ok());
  EXPECT_EQ(*steps, (std::vector<int64_t>{10, 20}));
  auto hint = ReadLatestHint(dir.Join("root"));
  ASSERT_TRUE(hint.ok());
  EXPECT_EQ(hint->value_or(-1), 20);
}

INSTANTIATE_TEST_SUITE_P(
    Backends, RoundTripTest,
    ::testing::Values(BackendParam{"UringDirect", IoBackend::kUring, DirectIoMode::kAuto},
                      BackendParam{"UringBuffered", IoBackend::kUring, DirectIoMode::kOff},
                      BackendParam{"ThreadsDirect", IoBackend::kThreads, DirectIoMode::kAuto},
                      BackendParam{"ThreadsBuffered", IoBackend::kThreads, DirectIoMode::kOff}),
    [](const auto& info) { return std::string(info.param.name); });

class BadInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto engine = Engine::Open(dir_.Join("root"), EngineOptions{});
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(*engine);
    good_ = RandomTensor("good", DType::kFloat32, {4}, 1);
  }
  // Expects `Save` to fail with `code` and a message containing `text`, and
  // that nothing appeared in the root.
  void ExpectRejected(int64_t step, std::vector<TensorView> views, absl::StatusCode code,
                      const std::string& text, const std::string& extras = "{}") {
    auto before = ListSteps(dir_.Join("root"));
    auto stats = engine_->Save(step, views, extras);
    ASSERT_FALSE(stats.ok());
    EXPECT_EQ(stats.status().code(), code) << stats.status();
    EXPECT_NE(std::string(stats.status().message()).find(text), std::string::npos)
        << stats.status();
    EXPECT_EQ(*ListSteps(dir_.Join("root")), *before);
  }
  ScratchDir dir_;
  std::unique_ptr<Engine> engine_;
  OwnedTensor good_;
};

TEST_F(BadInputTest, DuplicateNames) {
  ExpectRejected(1, {good_.view(), good_.view()}, absl::StatusCode::kInvalidArgument, "twice");
}

TEST_F(BadInputTest, EmptyName) {
  TensorView v = good_.view();
  v.name = "";
  ExpectRejected(1, {v}, absl::StatusCode::kInvalidArgument, "empty");
}

TEST_F(BadInputTest, NameWithNul) {
  TensorView v = good_.view();
  v.name = std::string("a\0b", 3);
  ExpectRejected(1, {v}, absl::StatusCode::kInvalidArgument, "NUL");
}

TEST_F(BadInputTest, NameWithInvalidUtf8) {
  TensorView v = good_.view();
  v.name = "bad\xff\xfe";
  ExpectRejected(1, {v}, absl::StatusCode::kInvalidArgument, "UTF-8");
}

TEST_F(BadInputTest, ShapeDoesNotMatchBytes) {
  TensorView v = good_.view();
  v.shape = {5};
  ExpectRejected(1, {v}, absl::StatusCode::kInvalidArgument, "nbytes");
}

TEST_F(BadInputTest, NegativeDimension) {
  TensorView v = good_.view();
  v.shape = {-4};
  ExpectRejected(1, {v}, absl::StatusCode::kInvalidArgument, "negative");
}

TEST_F(BadInputTest, UnknownDType) {
  TensorView v = good_.view();
  v.dtype = static_cast<DType>(200);
  ExpectRejected(1, {v}, absl::StatusCode::kInvalidArgument, "dtype");
}

TEST_F(BadInputTest, NegativeStep) {
  ExpectRejected(-1, {good_.view()}, absl::StatusCode::kInvalidArgument, "negative");
}

TEST_F(BadInputTest, ExtrasNotAnObject) {
  ExpectRejected(1, {good_.view()}, absl::StatusCode::kInvalidArgument, "extras", "[1,2]");
  ExpectRejected(1, {good_.view()}, absl::StatusCode::kInvalidArgument, "extras", "{oops");
}

TEST_F(BadInputTest, StepThatAlreadyExists) {
  ASSERT_TRUE(engine_->Save(1, std::vector<TensorView>{good_.view()}).ok());
  OwnedTensor other = RandomTensor("good", DType::kFloat32, {4}, 99);
  ExpectRejected(1, {other.view()}, absl::StatusCode::kAlreadyExists, "already exists");
  // The first checkpoint is untouched.
  auto reader = Reader::Open(dir_.Join("root"), ReaderOptions{});
  ASSERT_TRUE(reader.ok());
  auto t = (*reader)->Read("good");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(0, std::memcmp(t->data(), good_.bytes.data(), good_.bytes.size()));
}

TEST(EngineOpenTest, RootThatIsAFileIsRejected) {
  ScratchDir dir;
  std::ofstream(dir.Join("file")) << "x";
  auto engine = Engine::Open(dir.Join("file"), EngineOptions{});
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(engine.status().message()).find("not a directory"), std::string::npos);
}

TEST(EngineOpenTest, MissingParentIsAnError) {
  ScratchDir dir;
  auto engine = Engine::Open(dir.Join("no/such/root"), EngineOptions{});
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kNotFound) << engine.status();
}

TEST(ReaderOpenTest, MissingStepIsNotFound) {
  ScratchDir dir;
  auto engine = Engine::Open(dir.Join("root"), EngineOptions{});
  ASSERT_TRUE(engine.ok());
  OwnedTensor t = RandomTensor("w", DType::kFloat32, {4}, 1);
  ASSERT_TRUE((*engine)->Save(3, std::vector<TensorView>{t.view()}).ok());
  ReaderOptions options;
  options.step = 4;
  auto reader = Reader::Open(dir.Join("root"), options);
  ASSERT_FALSE(reader.ok());
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kNotFound);
}

TEST(ReaderOpenTest, TempDirectoriesAreNeverRead) {
  ScratchDir dir;
  auto engine = Engine::Open(dir.Join("root"), EngineOptions{});
  ASSERT_TRUE(engine.ok());
  ASSERT_EQ(0, mkdir(dir.Join("root/.tmp-step-00000000000000000009-abc").c_str(), 0755));
  auto reader = Reader::Open(dir.Join("root"), ReaderOptions{});
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kNotFound);
}

// Two engines in one process commit on their own persister threads at the
// same time; the names of their temp files and trash directories come from
// a generator that must not be shared unguarded (ThreadSanitizer checks it
// in the README's test command).
TEST(EngineConcurrencyTest, TwoEnginesSavingConcurrently) {
  ScratchDir dir;
  std::vector<OwnedTensor> state = {RandomTensor("a.w", DType::kFloat32, {1024}, 1),
                                    RandomTensor("b.w", DType::kFloat32, {1024}, 2)};
  auto run = [&](const std::string& root) {
    auto engine = Engine::Open(root, SmallChunks());
    ASSERT_TRUE(engine.ok()) << engine.status();
    for (int64_t step = 1; step <= 20; ++step) {
      ASSERT_TRUE((*engine)->Save(step, Views(state)).ok()) << root << " step " << step;
    }
  };
  std::thread first(run, dir.Join("one"));
  std::thread second(run, dir.Join("two"));
  first.join();
  second.join();
  ExpectCheckpointEquals(dir.Join("one"), 20, state);
  ExpectCheckpointEquals(dir.Join("two"), 20, state);
}

}  // namespace
}  // namespace ckpt
