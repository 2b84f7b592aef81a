// When the engine takes deltas and against what: differential and chained
// deltas, the bound on what a restore reads, and deltas that continue
// across a restart (issue 16). Every checkpoint is read back bit-exactly.
#include <cmath>
#include <cstring>
#include <random>

#include "ckpt/catalog.h"
#include "ckpt/engine.h"
#include "ckpt/reader.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace ckpt {
namespace {

using testing::ExpectCheckpointEquals;
using testing::OwnedTensor;
using testing::RandomTensor;
using testing::ScratchDir;
using testing::Views;

EngineOptions Options(DeltaOptions::Base base, int full_every, double factor) {
  EngineOptions options = testing::SmallChunks();
  options.delta.mode = DeltaOptions::Mode::kExact;
  options.delta.base = base;
  options.delta.full_every = full_every;
  options.delta.max_restore_read_factor = factor;
  return options;
}

// A state shaped like a small model with AdamW: weights plus first and
// second moments, every element of which changes a little each step.
std::vector<OwnedTensor> AdamLikeState() {
  std::vector<OwnedTensor> state;
  std::mt19937_64 rng(11);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (const char* name : {"block0.w", "block0.exp_avg", "block0.exp_avg_sq", "block1.w"}) {
    OwnedTensor t{name, DType::kFloat32, {64, 1024}, std::vector<uint8_t>(64 * 1024 * 4)};
    float* f = reinterpret_cast<float*>(t.bytes.data());
    for (int i = 0; i < 64 * 1024; ++i) f[i] = std::strstr(name, "sq") ? 1e-6f * (1 + std::fabs(normal(rng))) : normal(rng);
    state.push_back(std::move(t));
  }
  state.push_back(RandomTensor("step", DType::kInt64, {1}, 3));
  return state;
}

void Step(std::vector<OwnedTensor>& state, std::mt19937_64& rng) {
  std::normal_distribution<float> update(0.0f, 1e-4f);
  for (OwnedTensor& t : state) {
    if (t.dtype != DType::kFloat32) {
      ++*reinterpret_cast<int64_t*>(t.bytes.data());
      continue;
    }
    float* f = reinterpret_cast<float*>(t.bytes.data());
    for (size_t i = 0; i < t.bytes.size() / 4; ++i) f[i] += update(rng) * (std::fabs(f[i]) + 1e-6f);
  }
}

struct Saved {
  std::vector<OwnedTensor> state;
  SaveStats stats;
};

std::vector<Saved> SaveSteps(const std::string& root, const EngineOptions& options, int steps,
                             std::vector<OwnedTensor>& state, std::mt19937_64& rng, int first = 0) {
  std::vector<Saved> saved;
  auto engine = Engine::Open(root, options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return saved;
  for (int s = 0; s < steps; ++s) {
    Step(state, rng);
    auto stats = (*engine)->Save(first + s, Views(state));
    EXPECT_TRUE(stats.ok()) << stats.status();
    if (!stats.ok()) break;
    saved.push_back(Saved{state, *stats});
  }
  EXPECT_TRUE((*engine)->Close().ok());
  return saved;
}

std::map<int64_t, CheckpointSummary> Catalog(const std::string& root) {
  std::map<int64_t, CheckpointSummary> out;
  auto list = ListCheckpoints(root);
  EXPECT_TRUE(list.ok()) << list.status();
  if (list.ok()) {
    for (const CheckpointSummary& c : *list) out[c.step] = c;
  }
  return out;
}

TEST(DifferentialDeltaTest, EveryDeltaAppliesToTheLastFullSave) {
  ScratchDir dir;
  std::vector<OwnedTensor> state = AdamLikeState();
  std::mt19937_64 rng(1);
  const auto saved = SaveSteps(dir.Join("root"), Options(DeltaOptions::Base::kDifferential, 5, 0),
                               11, state, rng);
  ASSERT_EQ(saved.size(), 11u);
  const auto catalog = Catalog(dir.Join("root"));
  int64_t last_full = -1;
  for (int s = 0; s < 11; ++s) {
    const CheckpointSummary& info = catalog.at(s);
    if (s % 5 == 0) {
      EXPECT_EQ(info.kind, CheckpointKind::kFull) << "step " << s;
      last_full = s;
    } else {
      EXPECT_EQ(info.kind, CheckpointKind::kDelta) << "step " << s;
      EXPECT_EQ(info.base_step, last_full) << "step " << s;
      EXPECT_LT(saved[s].stats.file_bytes, saved[last_full].stats.file_bytes) << "step " << s;
    }
    ExpectCheckpointEquals(dir.Join("root"), s, saved[s].state);
  }
}

TEST(DifferentialDeltaTest, RestoreReadsOneFullAndOneDelta) {
  ScratchDir dir;
  std::vector<OwnedTensor> state = AdamLikeState();
  std::mt19937_64 rng(2);
  const auto saved = SaveSteps(dir.Join("root"), Options(DeltaOptions::Base::kDifferential, 11, 0),
                               11, state, rng);
  ASSERT_EQ(saved.size(), 11u);
  ReaderOptions options;
  auto reader = Reader::Open(dir.Join("root"), options);
  ASSERT_TRUE(reader.ok()) << reader.status();
  ASSERT_TRUE((*reader)->ReadAll().ok());
  // The full save and the newest delta, nothing of the nine in between.
  EXPECT_LE((*reader)->bytes_read(),
            saved[0].stats.file_bytes + saved[10].stats.file_bytes + 64 * 4096);
}

TEST(ChainedDeltaTest, AFullSaveComesEarlyWhenARestoreWouldReadTooMuch) {
  ScratchDir dir;
  std::vector<OwnedTensor> state = AdamLikeState();
  std::mt19937_64 rng(3);
  constexpr double kFactor = 2.5;
  const auto saved = SaveSteps(dir.Join("root"), Options(DeltaOptions::Base::kChained, 1000, kFactor),
                               12, state, rng);
  ASSERT_EQ(saved.size(), 12u);
  const auto catalog = Catalog(dir.Join("root"));
  int fulls = 0;
  uint64_t full_bytes = 0, chain = 0;
  for (int s = 0; s < 12; ++s) {
    const CheckpointSummary& info = catalog.at(s);
    if (info.kind == CheckpointKind::kFull) {
      ++fulls;
      full_bytes = chain = saved[s].stats.file_bytes;
    } else {
      EXPECT_EQ(info.base_step, s - 1);
      chain += saved[s].stats.file_bytes;
    }
    // What a restore of this step reads stays within the bound.
    EXPECT_LE(static_cast<double>(chain), kFactor * full_bytes) << "step " << s;
    ReaderOptions options;
    options.step = s;
    auto reader = Reader::Open(dir.Join("root"), options);
    ASSERT_TRUE(reader.ok());
    ASSERT_TRUE((*reader)->ReadAll().ok());
    EXPECT_LE((*reader)->bytes_read(), kFactor * full_bytes + 64 * 4096 * 12) << "step " << s;
    ExpectCheckpointEquals(dir.Join("root"), s, saved[s].state);
  }
  // Dense deltas are well over a tenth of the full: the bound took fulls
  // early (full_every alone would have taken one).
  EXPECT_GT(fulls, 1);
}

TEST(ChainedDeltaTest, NoBoundKeepsTheChainUntilFullEvery) {
  ScratchDir dir;
  std::vector<OwnedTensor> state = AdamLikeState();
  std::mt19937_64 rng(4);
  const auto saved =
      SaveSteps(dir.Join("root"), Options(DeltaOptions::Base::kChained, 8, 0), 9, state, rng);
  ASSERT_EQ(saved.size(), 9u);
  const auto catalog = Catalog(dir.Join("root"));
  for (int s = 0; s < 9; ++s) {
    EXPECT_EQ(catalog.at(s).kind, s % 8 == 0 ? CheckpointKind::kFull : CheckpointKind::kDelta) << s;
  }
  ExpectCheckpointEquals(dir.Join("root"), 7, saved[7].state);
}

TEST(ChainedDeltaTest, ADamagedLinkIsNamedAndOnlyItsDependantsFail) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  std::vector<OwnedTensor> state = AdamLikeState();
  std::mt19937_64 rng(8);
  const auto saved = SaveSteps(root, Options(DeltaOptions::Base::kChained, 100, 0), 6, state, rng);
  ASSERT_EQ(saved.size(), 6u);
  // Flip a byte in the middle of step 3's delta of block0.w.
  ReaderOptions at3;
  at3.step = 3;
  auto reader = Reader::Open(root, at3);
  ASSERT_TRUE(reader.ok());
  const TensorInfo info = *(*reader)->Find("block0.w");
  ASSERT_TRUE(IsDeltaEncoding(info.encoding)) << info.encoding;
  const std::string shard = (*reader)->dir() + "/" + info.shard;
  reader->reset();
  {
    FILE* f = std::fopen(shard.c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    std::fseek(f, static_cast<long>(info.offset + info.stored_bytes / 2), SEEK_SET);
    const int c = std::fgetc(f);
    std::fseek(f, static_cast<long>(info.offset + info.stored_bytes / 2), SEEK_SET);
    std::fputc(c ^ 0x40, f);
    std::fclose(f);
  }
  for (int step : {3, 5}) {
    ReaderOptions at;
    at.step = step;
    auto r = Reader::Open(root, at);
    ASSERT_TRUE(r.ok());
    auto all = (*r)->ReadAll();
    ASSERT_FALSE(all.ok()) << "step " << step;
    EXPECT_EQ(all.status().code(), absl::StatusCode::kDataLoss);
    // The damaged link, not the step read, is named.
    EXPECT_NE(all.status().message().find("step-00000000000000000003"), std::string::npos) << all.status();
    EXPECT_NE(all.status().message().find("block0.w"), std::string::npos) << all.status();
    // The other tensors of the chain still read.
    EXPECT_TRUE((*r)->Read("block1.w").ok());
  }
  ExpectCheckpointEquals(root, 2, saved[2].state);
}

class ResumeDeltaTest : public ::testing::TestWithParam<DeltaOptions::Base> {};

TEST_P(ResumeDeltaTest, TheFirstSaveAfterARestartIsADelta) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  std::vector<OwnedTensor> state = AdamLikeState();
  std::mt19937_64 rng(5);
  const EngineOptions options = Options(GetParam(), 10, 0);
  auto first = SaveSteps(root, options, 3, state, rng);
  ASSERT_EQ(first.size(), 3u);
  auto second = SaveSteps(root, options, 3, state, rng, /*first=*/3);
  ASSERT_EQ(second.size(), 3u);
  const auto catalog = Catalog(root);
  EXPECT_EQ(catalog.at(3).kind, CheckpointKind::kDelta);
  EXPECT_EQ(catalog.at(3).base_step, GetParam() == DeltaOptions::Base::kDifferential ? 0 : 2);
  EXPECT_LT(second[0].stats.file_bytes, first[0].stats.file_bytes);
  for (int s = 0; s < 6; ++s) ExpectCheckpointEquals(root, s, s < 3 ? first[s].state : second[s - 3].state);
  // Counting the deltas before the restart: full_every still holds.
  auto third = SaveSteps(root, options, 5, state, rng, /*first=*/6);
  ASSERT_EQ(third.size(), 5u);
  const auto after = Catalog(root);
  EXPECT_EQ(after.at(9).kind, CheckpointKind::kDelta);
  EXPECT_EQ(after.at(10).kind, CheckpointKind::kFull);
  ExpectCheckpointEquals(root, 10, third[4].state);
}

TEST_P(ResumeDeltaTest, TurnedOffTheFirstSaveIsFull) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  std::vector<OwnedTensor> state = AdamLikeState();
  std::mt19937_64 rng(6);
  EngineOptions options = Options(GetParam(), 10, 0);
  ASSERT_EQ(SaveSteps(root, options, 2, state, rng).size(), 2u);
  options.delta.resume_from_newest = false;
  ASSERT_EQ(SaveSteps(root, options, 1, state, rng, 2).size(), 1u);
  EXPECT_EQ(Catalog(root).at(2).kind, CheckpointKind::kFull);
}

TEST_P(ResumeDeltaTest, ADamagedNewestIsNotTakenAsTheReference) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  std::vector<OwnedTensor> state = AdamLikeState();
  std::mt19937_64 rng(7);
  const EngineOptions options = Options(GetParam(), 10, 0);
  auto first = SaveSteps(root, options, 3, state, rng);
  ASSERT_EQ(first.size(), 3u);
  // Step 2's manifest is damaged: the newest readable checkpoint is step 1.
  const std::string manifest = root + "/step-00000000000000000002/MANIFEST.json";
  {
    FILE* f = std::fopen(manifest.c_str(), "r+b");
    ASSERT_NE(f, nullptr) << manifest;
    std::fseek(f, 20, SEEK_SET);
    std::fputc('#', f);
    std::fclose(f);
  }
  auto second = SaveSteps(root, options, 2, state, rng, 3);
  ASSERT_EQ(second.size(), 2u);
  for (int s = 3; s < 5; ++s) ExpectCheckpointEquals(root, s, second[s - 3].state);
  if (GetParam() == DeltaOptions::Base::kChained) EXPECT_EQ(Catalog(root).at(3).base_step, 1);
}

INSTANTIATE_TEST_SUITE_P(Bases, ResumeDeltaTest,
                         ::testing::Values(DeltaOptions::Base::kDifferential, DeltaOptions::Base::kChained),
                         [](const auto& info) {
                           return info.param == DeltaOptions::Base::kDifferential ? "Differential" : "Chained";
                         });

}  // namespace
}  // namespace ckpt
