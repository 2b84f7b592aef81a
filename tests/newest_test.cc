// ckpt/newest.h: the newest checkpoint that reads back, and Reader::Verify's
// progress reports.
#include "ckpt/newest.h"

#include <fcntl.h>
#include <unistd.h>

#include <numeric>

#include "ckpt/catalog.h"
#include "ckpt/engine.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace ckpt {
namespace {

using testing::OwnedTensor;
using testing::RandomTensor;
using testing::ScratchDir;
using testing::SmallChunks;
using testing::Views;

std::vector<OwnedTensor> State(uint64_t seed) {
  return {RandomTensor("embed", DType::kFloat32, {300, 64}, seed),
          RandomTensor("fc.weight", DType::kBFloat16, {128, 96}, seed + 1),
          RandomTensor("fc.bias", DType::kFloat32, {96}, seed + 2),
          RandomTensor("empty", DType::kFloat32, {0, 4}, seed + 3)};
}

uint64_t RawBytes(const Reader& reader) {
  uint64_t total = 0;
  for (const TensorInfo& t : reader.tensors()) total += t.raw_bytes;
  return total;
}

// Flips one byte in the middle of tensor `name`'s record of `step`.
void Damage(const std::string& root, int64_t step, const std::string& name) {
  ReaderOptions options;
  options.step = step;
  auto reader = Reader::Open(root, options);
  ASSERT_TRUE(reader.ok()) << reader.status();
  const TensorInfo* info = (*reader)->Find(name);
  ASSERT_NE(info, nullptr);
  const std::string path = (*reader)->dir() + "/" + info->shard;
  const int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0) << path;
  const off_t at = static_cast<off_t>(info->offset + info->stored_bytes / 2);
  char byte = 0;
  ASSERT_EQ(::pread(fd, &byte, 1, at), 1);
  byte ^= 0x5a;
  ASSERT_EQ(::pwrite(fd, &byte, 1, at), 1);
  ::close(fd);
}

// Saves steps 1..n with `options`, each a new random state.
void SaveSteps(const std::string& root, EngineOptions options, int n) {
  auto engine = Engine::Open(root, options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  for (int step = 1; step <= n; ++step) {
    std::vector<OwnedTensor> state = State(100 * step);
    // Deltas need changes smaller than the tensors: change a few elements only.
    if (step > 1) state = State(100);
    state[0].bytes[step * 8] ^= 0xff;
    ASSERT_TRUE((*engine)->Save(step, Views(state)).ok());
  }
  ASSERT_TRUE((*engine)->Close(Engine::CloseMode::kWait).ok());
}

TEST(NewestFirstTest, HandsOutStepsNewestFirstAndWordsWhatItSkipped) {
  NewestFirst walk({3, 10, 7});
  std::vector<int64_t> order;
  while (std::optional<int64_t> step = walk.Next()) {
    order.push_back(*step);
    walk.Skip(*step, absl::DataLossError(absl::StrCat("bad ", *step)));
  }
  EXPECT_EQ(order, (std::vector<int64_t>{10, 7, 3}));
  EXPECT_EQ(walk.skipped().size(), 3u);
  const absl::Status none = walk.NoneLeft();
  EXPECT_TRUE(absl::IsNotFound(none)) << none;
  EXPECT_EQ(none.message(),
            "no checkpoint reads back intact (step 10: DATA_LOSS: bad 10; step 7: DATA_LOSS: "
            "bad 7; step 3: DATA_LOSS: bad 3)");
  EXPECT_EQ(NewestFirst({}).NoneLeft().message(), "no committed checkpoint");
}

struct VerifyParam {
  const char* name;
  DeltaOptions::Mode delta;
  int compression_level;
};

class VerifyProgressTest : public ::testing::TestWithParam<VerifyParam> {};

TEST_P(VerifyProgressTest, CountsEveryTensorByteOnceAndStopsCountingAtTheDamage) {
  ScratchDir dir;
  EngineOptions options = SmallChunks();
  options.delta.mode = GetParam().delta;
  options.compression_level = GetParam().compression_level;
  SaveSteps(dir.path(), options, 3);
  for (int64_t step = 1; step <= 3; ++step) {
    ReaderOptions read;
    read.step = step;
    auto reader = Reader::Open(dir.path(), read);
    ASSERT_TRUE(reader.ok()) << reader.status();
    uint64_t counted = 0;
    int calls = 0;
    ASSERT_TRUE((*reader)->Verify([&](uint64_t n) {
                            counted += n;
                            ++calls;
                          }).ok());
    EXPECT_EQ(counted, RawBytes(**reader)) << "step " << step;
    EXPECT_GT(calls, 1) << "step " << step;
  }
  Damage(dir.path(), 3, "fc.weight");
  ReaderOptions read;
  read.step = 3;
  auto reader = Reader::Open(dir.path(), read);
  ASSERT_TRUE(reader.ok()) << reader.status();
  uint64_t counted = 0;
  const absl::Status status = (*reader)->Verify([&](uint64_t n) { counted += n; });
  EXPECT_TRUE(absl::IsDataLoss(status)) << status;
  EXPECT_NE(status.message().find("fc.weight"), std::string::npos) << status;
  EXPECT_LT(counted, RawBytes(**reader));
}

INSTANTIATE_TEST_SUITE_P(Modes, VerifyProgressTest,
                         ::testing::Values(VerifyParam{"Full", DeltaOptions::Mode::kNone, 0},
                                           VerifyParam{"FullZstd", DeltaOptions::Mode::kNone, 3},
                                           VerifyParam{"ExactDelta", DeltaOptions::Mode::kExact, 0}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(OpenNewestTest, FallsBackPastADamagedNewestAndReportsIt) {
  ScratchDir dir;
  SaveSteps(dir.path(), SmallChunks(), 3);
  Damage(dir.path(), 3, "embed");
  std::vector<SkippedCheckpoint> skipped;
  uint64_t counted = 0;
  auto reader = OpenNewestVerified(
      dir.path(), {}, [&](uint64_t n) { counted += n; },
      [&](const SkippedCheckpoint& s) { skipped.push_back(s); });
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->step(), 2);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_EQ(skipped[0].step, 3);
  EXPECT_TRUE(absl::IsDataLoss(skipped[0].why)) << skipped[0].why;
  // Step 3 counted until its damage, then step 2 all of its bytes.
  EXPECT_GE(counted, RawBytes(**reader));
}

TEST(OpenNewestTest, ANamedStepIsNeverReplacedByAnother) {
  ScratchDir dir;
  SaveSteps(dir.path(), SmallChunks(), 2);
  Damage(dir.path(), 2, "embed");
  ReaderOptions options;
  options.step = 2;
  int skips = 0;
  auto reader = OpenNewestVerified(dir.path(), options, nullptr,
                                   [&](const SkippedCheckpoint&) { ++skips; });
  EXPECT_TRUE(absl::IsDataLoss(reader.status())) << reader.status();
  EXPECT_EQ(skips, 0);
}

TEST(OpenNewestTest, NothingIntactIsNotFoundListingEveryStep) {
  ScratchDir dir;
  SaveSteps(dir.path(), SmallChunks(), 2);
  Damage(dir.path(), 1, "embed");
  Damage(dir.path(), 2, "fc.bias");
  auto reader = OpenNewestVerified(dir.path(), {}, nullptr);
  ASSERT_TRUE(absl::IsNotFound(reader.status())) << reader.status();
  EXPECT_NE(reader.status().message().find("step 2: DATA_LOSS"), std::string::npos);
  EXPECT_NE(reader.status().message().find("step 1: DATA_LOSS"), std::string::npos);

  ScratchDir empty;
  auto none = OpenNewestVerified(empty.path(), {}, nullptr);
  EXPECT_EQ(none.status().message(), "no committed checkpoint");
}

TEST(OpenNewestTest, TheCallersTestDecides) {
  ScratchDir dir;
  SaveSteps(dir.path(), SmallChunks(), 3);
  std::vector<int64_t> tried;
  auto reader = OpenNewest(dir.path(), {}, [&](Reader& r) {
    tried.push_back(r.step());
    return r.step() == 1 ? absl::OkStatus() : absl::InvalidArgumentError("not this one");
  });
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->step(), 1);
  EXPECT_EQ(tried, (std::vector<int64_t>{3, 2, 1}));
}

}  // namespace
}  // namespace ckpt
