// Delta checkpoints: exact chains restore bit-exactly; top-k error stays
// within the recorded, non-accumulating bound; broken chains fail clearly.
#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <random>

#include "absl/strings/str_cat.h"
#include "ckpt/catalog.h"
#include "ckpt/engine.h"
#include "ckpt/reader.h"
#include "delta/delta_codec.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace ckpt {
namespace {

using testing::OwnedTensor;
using testing::RandomTensor;
using testing::ScratchDir;
using testing::Views;

EngineOptions DeltaEngine(DeltaOptions::Mode mode, int full_every, double ratio = 0.01) {
  EngineOptions options;
  options.io.chunk_bytes = 64 << 10;
  options.shard_min_bytes = 64 << 10;
  options.delta.mode = mode;
  // These tests are about chains of deltas: each against the one before.
  options.delta.base = DeltaOptions::Base::kChained;
  options.delta.max_restore_read_factor = 0;
  options.delta.full_every = full_every;
  options.delta.topk_ratio = ratio;
  return options;
}

std::vector<OwnedTensor> ReadAllAt(const std::string& root, int64_t step) {
  ReaderOptions options;
  options.step = step;
  auto reader = Reader::Open(root, options);
  EXPECT_TRUE(reader.ok()) << reader.status();
  if (!reader.ok()) return {};
  EXPECT_TRUE((*reader)->Verify().ok());
  std::vector<OwnedTensor> out;
  for (const TensorInfo& info : (*reader)->tensors()) {
    OwnedTensor t{info.name, info.dtype, info.shape, std::vector<uint8_t>(info.raw_bytes)};
    ReadTarget target{info.name, t.bytes.data(), t.bytes.size()};
    absl::Status s = (*reader)->ReadInto({&target, 1});
    EXPECT_TRUE(s.ok()) << s;
    out.push_back(std::move(t));
  }
  return out;
}

// Changes `fraction` of the elements of `t` (random bit patterns).
void Mutate(OwnedTensor& t, double fraction, std::mt19937_64& rng) {
  const size_t elem = DTypeSize(t.dtype);
  const size_t n = t.bytes.size() / elem;
  const size_t changes = static_cast<size_t>(fraction * n);
  for (size_t c = 0; c < changes; ++c) {
    const size_t i = fraction >= 1.0 ? c : rng() % n;
    for (size_t b = 0; b < elem; ++b) t.bytes[i * elem + b] = static_cast<uint8_t>(rng());
    if (t.dtype == DType::kBool) t.bytes[i] &= 1;
  }
}

TEST(ExactDeltaTest, TwentyFiveDeltasOfEveryPatternAndDTypeRestoreBitExactly) {
  ScratchDir dir;
  auto engine = Engine::Open(dir.Join("root"), DeltaEngine(DeltaOptions::Mode::kExact, 1000));
  ASSERT_TRUE(engine.ok());
  std::vector<OwnedTensor> state;
  uint64_t seed = 1;
  for (int d = 0; d < kNumDTypes; ++d) {
    const DType dtype = static_cast<DType>(d);
    state.push_back(RandomTensor("t." + std::string(DTypeName(dtype)), dtype, {5003}, seed++));
  }
  state.push_back(RandomTensor("big.w", DType::kFloat32, {200000}, seed++));  // spans chunks
  state.push_back(RandomTensor("empty.w", DType::kFloat32, {0}, seed++));
  std::mt19937_64 rng(7);
  const double patterns[] = {0.0, 0.001, 0.01, 0.5, 1.0};
  std::vector<std::vector<OwnedTensor>> history;
  for (int step = 0; step <= 25; ++step) {
    if (step > 0) {
      for (auto& t : state) Mutate(t, patterns[step % 5], rng);
      // Special float values: NaN payloads, -0.0, infinities.
      float* f = reinterpret_cast<float*>(state[static_cast<int>(DType::kFloat32)].bytes.data());
      f[step] = std::bit_cast<float>(0x7FC00000u | static_cast<uint32_t>(step));
      f[step + 100] = -0.0f;
      f[step + 200] = step % 2 ? std::numeric_limits<float>::infinity()
                               : -std::numeric_limits<float>::infinity();
    }
    auto stats = (*engine)->Save(step, Views(state));
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_EQ(stats->kind, step == 0 ? CheckpointKind::kFull : CheckpointKind::kDelta) << "step " << step;
    history.push_back(state);
  }
  for (int step = 0; step <= 25; ++step) {
    std::vector<OwnedTensor> got = ReadAllAt(dir.Join("root"), step);
    ASSERT_EQ(got.size(), history[step].size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].bytes, history[step][i].bytes) << got[i].name << " at step " << step;
    }
  }
}

TEST(ExactDeltaTest, DeltaOfOnePercentIsSmall) {
  ScratchDir dir;
  auto engine = Engine::Open(dir.Join("root"), DeltaEngine(DeltaOptions::Mode::kExact, 10));
  ASSERT_TRUE(engine.ok());
  std::vector<OwnedTensor> state = {RandomTensor("w", DType::kFloat32, {1 << 20}, 1)};
  auto full = (*engine)->Save(1, Views(state));
  ASSERT_TRUE(full.ok());
  std::mt19937_64 rng(3);
  Mutate(state[0], 0.01, rng);
  auto delta = (*engine)->Save(2, Views(state));
  ASSERT_TRUE(delta.ok());
  EXPECT_EQ(delta->kind, CheckpointKind::kDelta);
  EXPECT_LT(static_cast<double>(delta->file_bytes) / full->file_bytes, 0.025);
}

TEST(DeltaPolicyTest, FullEveryNAndFallbackToFullWhenNotSmaller) {
  ScratchDir dir;
  auto engine = Engine::Open(dir.Join("root"), DeltaEngine(DeltaOptions::Mode::kExact, 3));
  ASSERT_TRUE(engine.ok());
  std::vector<OwnedTensor> state = {RandomTensor("w", DType::kFloat32, {10000}, 1)};
  std::mt19937_64 rng(5);
  std::vector<std::optional<CheckpointKind>> kinds;
  for (int step = 0; step < 7; ++step) {
    Mutate(state[0], 0.01, rng);
    auto stats = (*engine)->Save(step, Views(state));
    ASSERT_TRUE(stats.ok());
    kinds.push_back(stats->kind);
  }
  constexpr CheckpointKind kF = CheckpointKind::kFull, kD = CheckpointKind::kDelta;
  EXPECT_EQ(kinds, (std::vector<std::optional<CheckpointKind>>{kF, kD, kD, kF, kD, kD, kF}));
  // Every element changed to random bits: a delta would not be smaller.
  Mutate(state[0], 1.0, rng);
  auto stats = (*engine)->Save(100, Views(state));
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->kind, CheckpointKind::kFull);
  auto got = ReadAllAt(dir.Join("root"), 100);
  EXPECT_EQ(got[0].bytes, state[0].bytes);
}

// A delta whose every tensor was stored whole (none would be smaller) is a
// full checkpoint. Before the fix, a differential engine then took deltas
// labelled against it while its reference still held the older full save's
// values (every later save fell back whole; one close to the old values
// would have restored wrong, caught only by its checksum).
TEST(DeltaPolicyTest, DeltasAfterASaveWhoseEveryTensorFellBackRestore) {
  for (DeltaOptions::Base base : {DeltaOptions::Base::kDifferential, DeltaOptions::Base::kChained}) {
    for (DeltaOptions::Mode mode : {DeltaOptions::Mode::kExact, DeltaOptions::Mode::kTopK}) {
      const std::string what = absl::StrCat(base == DeltaOptions::Base::kDifferential ? "differential" : "chained",
                                            mode == DeltaOptions::Mode::kExact ? " exact" : " top-k");
      ScratchDir dir;
      EngineOptions options = DeltaEngine(mode, 100, /*ratio=*/1.0);
      options.delta.base = base;
      auto engine = Engine::Open(dir.Join("root"), options);
      ASSERT_TRUE(engine.ok()) << what;
      std::vector<OwnedTensor> state = {RandomTensor("a", DType::kFloat32, {10000}, 1),
                                        RandomTensor("b", DType::kInt64, {3000}, 2)};
      std::mt19937_64 rng(7);
      std::vector<std::optional<CheckpointKind>> kinds;
      std::map<int64_t, std::vector<OwnedTensor>> saved;
      for (int64_t step = 1; step <= 5; ++step) {
        // Step 3: every element of every tensor changes to random bits;
        // step 4 goes back to close to step 2 (close to the full save too).
        if (step == 4) state = saved[2];
        for (OwnedTensor& t : state) Mutate(t, step == 3 ? 1.0 : 0.01, rng);
        auto stats = (*engine)->Save(step, Views(state));
        ASSERT_TRUE(stats.ok()) << what << " step " << step << ": " << stats.status();
        kinds.push_back(stats->kind);
        saved[step] = state;
      }
      // Step 4 is full either way: chained, because it is far from step 3
      // (every tensor falls back again); differential, because the
      // reference held step 1's values, not the step 3 it would be against.
      constexpr CheckpointKind kF = CheckpointKind::kFull, kD = CheckpointKind::kDelta;
      EXPECT_EQ(kinds, (std::vector<std::optional<CheckpointKind>>{kF, kD, kF, kF, kD})) << what;
      ASSERT_TRUE((*engine)->Close().ok());
      auto summary = SummarizeCheckpoint(dir.Join("root"), 5);
      ASSERT_TRUE(summary.ok()) << summary.status();
      EXPECT_EQ(summary->base_step, 4) << what;
      for (const auto& [step, want] : saved) {
        std::vector<OwnedTensor> got = ReadAllAt(dir.Join("root"), step);
        ASSERT_EQ(got.size(), want.size()) << what << " step " << step;
        for (size_t i = 0; i < want.size(); ++i) {
          EXPECT_EQ(got[i].bytes, want[i].bytes) << what << " step " << step << " " << want[i].name;
        }
      }
    }
  }
}

TEST(DeltaPolicyTest, NewEngineContinuesFromTheNewestUnlessTurnedOff) {
  ScratchDir dir;
  std::vector<OwnedTensor> state = {RandomTensor("w", DType::kFloat32, {1000}, 1)};
  {
    auto engine = Engine::Open(dir.Join("root"), DeltaEngine(DeltaOptions::Mode::kExact, 10));
    ASSERT_TRUE((*engine)->Save(1, Views(state)).ok());
    ASSERT_EQ((*engine)->Save(2, Views(state))->kind, CheckpointKind::kDelta);
  }
  {
    // The reference is read back from step 2: the chain goes on.
    auto engine = Engine::Open(dir.Join("root"), DeltaEngine(DeltaOptions::Mode::kExact, 10));
    auto stats = (*engine)->Save(3, Views(state));
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_EQ(stats->kind, CheckpointKind::kDelta);
  }
  EngineOptions off = DeltaEngine(DeltaOptions::Mode::kExact, 10);
  off.delta.resume_from_newest = false;
  auto engine = Engine::Open(dir.Join("root"), off);
  EXPECT_EQ((*engine)->Save(4, Views(state))->kind, CheckpointKind::kFull);
  EXPECT_EQ(ReadAllAt(dir.Join("root"), 3)[0].bytes, state[0].bytes);
}

TEST(TopKDeltaTest, ErrorStaysWithinTheRecordedBoundAndDoesNotAccumulate) {
  ScratchDir dir;
  auto engine = Engine::Open(dir.Join("root"), DeltaEngine(DeltaOptions::Mode::kTopK, 1000, 0.01));
  ASSERT_TRUE(engine.ok());
  const int64_t n = 20000;
  std::vector<OwnedTensor> state = {OwnedTensor{"layer.w", DType::kFloat32, {n}, std::vector<uint8_t>(n * 4)}};
  float* x = reinterpret_cast<float*>(state[0].bytes.data());
  std::mt19937_64 rng(11);
  std::normal_distribution<float> noise(0.0f, 1e-3f);
  for (int64_t i = 0; i < n; ++i) x[i] = noise(rng) * 1000;
  std::vector<std::vector<float>> truth;
  for (int step = 0; step <= 50; ++step) {
    if (step > 0) {
      for (int64_t i = 0; i < n; ++i) x[i] += noise(rng);  // dense updates
    }
    auto stats = (*engine)->Save(step, Views(state));
    ASSERT_TRUE(stats.ok()) << stats.status();
    truth.emplace_back(x, x + n);
  }
  double largest_bound = 0;
  for (int step = 1; step <= 50; ++step) {
    ReaderOptions options;
    options.step = step;
    auto reader = Reader::Open(dir.Join("root"), options);
    ASSERT_TRUE(reader.ok()) << reader.status();
    const TensorInfo* info = (*reader)->Find("layer.w");
    ASSERT_EQ(info->encoding, RecordEncoding::kTopK);
    std::vector<float> restored(n);
    ReadTarget target{"layer.w", restored.data(), restored.size() * 4};
    ASSERT_TRUE((*reader)->ReadInto({&target, 1}).ok());
    double error = 0;
    for (int64_t i = 0; i < n; ++i) {
      error = std::max(error, std::fabs(static_cast<double>(restored[i]) - truth[step][i]));
    }
    // Within the bound recorded for this step, and the bound is tight: it is
    // this one delta's largest dropped change, not a sum along the chain.
    EXPECT_LE(error, info->error_bound) << "step " << step;
    EXPECT_NEAR(error, info->error_bound, 1e-12) << "step " << step;
    largest_bound = std::max(largest_bound, info->error_bound);
  }
  // A delta against the true previous state, restored by summing the kept
  // changes, would drift by ~sqrt(50) x one step's drop with no recorded bound
  // covering it; here the bound stays small next to the total movement.
  double moved = 0;
  for (int64_t i = 0; i < n; ++i) moved = std::max(moved, static_cast<double>(std::fabs(truth[50][i] - truth[0][i])));
  EXPECT_LT(largest_bound, moved);
}

TEST(TopKDeltaTest, KeepsExactlyCeilRatioTimesNumel) {
  std::vector<float> x(1000), r(1000, 0.0f);
  for (int i = 0; i < 1000; ++i) x[i] = static_cast<float>(i + 1);
  std::vector<float> reference = r;
  internal::Piece piece{reinterpret_cast<const char*>(x.data()), x.size() * 4};
  auto record = internal::EncodeTopKDelta({&piece, 1}, reinterpret_cast<char*>(reference.data()),
                                          x.size() * 4, DType::kFloat32, 0.0105, 1);
  ASSERT_TRUE(record.ok());
  EXPECT_EQ(record->changed, 11u);  // ceil(10.5)
  EXPECT_EQ(record->error_bound, 989.0);  // the largest dropped |x - r|
  for (int i = 0; i < 989; ++i) EXPECT_EQ(reference[i], 0.0f);
  for (int i = 989; i < 1000; ++i) EXPECT_EQ(reference[i], x[i]);
  std::vector<float> applied(1000, 0.0f);
  ASSERT_TRUE(internal::ApplyDelta(RecordEncoding::kTopK, record->bytes.data(), record->bytes.size(),
                                   reinterpret_cast<char*>(applied.data()), 4000, DType::kFloat32)
                  .ok());
  EXPECT_EQ(applied, reference);
}

class BrokenChainTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto engine = Engine::Open(dir_.Join("root"), DeltaEngine(DeltaOptions::Mode::kExact, 100));
    ASSERT_TRUE(engine.ok());
    state_ = {RandomTensor("m.w", DType::kFloat32, {20000}, 1)};
    std::mt19937_64 rng(9);
    for (int step = 1; step <= 5; ++step) {
      if (step > 1) Mutate(state_[0], 0.01, rng);
      ASSERT_EQ((*engine)->Save(step, Views(state_))->kind, step == 1 ? CheckpointKind::kFull : CheckpointKind::kDelta);
      history_.push_back(state_[0].bytes);
    }
  }
  std::string StepDir(int64_t step) { return dir_.Join("root/" + StepDirName(step)); }
  ScratchDir dir_;
  std::vector<OwnedTensor> state_;
  std::vector<std::vector<uint8_t>> history_;
};

TEST_F(BrokenChainTest, RemovedBaseFailsDependantsAndLatestFallsBack) {
  testing::RemoveTree(StepDir(3));
  ReaderOptions options;
  options.step = 5;
  auto reader = Reader::Open(dir_.Join("root"), options);
  ASSERT_FALSE(reader.ok());
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(std::string(reader.status().message()).find("base checkpoint step 3"), std::string::npos)
      << reader.status();
  auto latest = Reader::Open(dir_.Join("root"), ReaderOptions{});
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ((*latest)->step(), 2);
  std::vector<uint8_t> got(history_[1].size());
  ReadTarget target{"m.w", got.data(), got.size()};
  ASSERT_TRUE((*latest)->ReadInto({&target, 1}).ok());
  EXPECT_EQ(got, history_[1]);
}

TEST_F(BrokenChainTest, ReplacedBaseIsDetected) {
  // Rewrite step 2's manifest with another (valid) checksum: its extras.
  const std::string manifest = StepDir(2) + "/MANIFEST.json";
  std::string text;
  {
    std::ifstream in(manifest);
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  testing::RemoveTree(StepDir(2));
  auto engine = Engine::Open(dir_.Join("root"), DeltaEngine(DeltaOptions::Mode::kNone, 1));
  ASSERT_TRUE((*engine)->Save(2, Views(state_)).ok());  // a different step-2
  ReaderOptions options;
  options.step = 4;
  auto reader = Reader::Open(dir_.Join("root"), options);
  ASSERT_FALSE(reader.ok());
  EXPECT_NE(std::string(reader.status().message()).find("not the one the delta was written against"),
            std::string::npos)
      << reader.status();
}

TEST_F(BrokenChainTest, CorruptBaseDataFailsTheDependantRead) {
  {
    std::fstream f(StepDir(1) + "/m.0.shard", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(1000);
    f.put('\x7f');
  }
  ReaderOptions options;
  options.step = 5;
  auto reader = Reader::Open(dir_.Join("root"), options);
  ASSERT_TRUE(reader.ok());  // manifests are intact
  std::vector<uint8_t> got(history_[4].size());
  ReadTarget target{"m.w", got.data(), got.size()};
  absl::Status s = (*reader)->ReadInto({&target, 1});
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(std::string(s.message()).find(StepDirName(1)), std::string::npos) << s;
  EXPECT_EQ((*reader)->Verify().code(), absl::StatusCode::kDataLoss);
}

TEST(DeltaCatalogTest, ListShowsKindBaseAndBound) {
  ScratchDir dir;
  auto engine = Engine::Open(dir.Join("root"), DeltaEngine(DeltaOptions::Mode::kTopK, 10, 0.1));
  std::vector<OwnedTensor> state = {RandomTensor("w", DType::kFloat32, {1000}, 1)};
  float* f = reinterpret_cast<float*>(state[0].bytes.data());
  for (int i = 0; i < 1000; ++i) f[i] = static_cast<float>(i);
  ASSERT_TRUE((*engine)->Save(1, Views(state)).ok());
  for (int i = 0; i < 1000; ++i) f[i] += 0.5f + i * 1e-3f;
  ASSERT_TRUE((*engine)->Save(2, Views(state)).ok());
  auto list = ListCheckpoints(dir.Join("root"));
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].kind, CheckpointKind::kFull);
  EXPECT_EQ((*list)[1].kind, CheckpointKind::kDelta);
  EXPECT_EQ((*list)[1].base_step, 1);
  EXPECT_EQ((*list)[1].delta_mode, DeltaOptions::Mode::kTopK);
  EXPECT_GT((*list)[1].max_error_bound, 0.0);
}

}  // namespace
}  // namespace ckpt
