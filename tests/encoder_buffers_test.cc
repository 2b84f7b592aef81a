// Encoded saves (deltas, zstd) write through a few output buffers shared by
// every shard. No number of shards or buffers may deadlock a save: these
// tests hung before `ShardOutputs` learned to spill a partial buffer.
#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <random>

#include "absl/strings/str_cat.h"
#include "ckpt/engine.h"
#include "ckpt/reader.h"
#include "engine/shard_outputs.h"
#include "format/manifest.h"
#include "gtest/gtest.h"
#include "test_util.h"
#include "ckpt/file_system.h"

namespace ckpt {
namespace {

using internal::ShardLayout;
using internal::ShardOutputs;
using testing::OwnedTensor;
using testing::RandomTensor;
using testing::ScratchDir;
using testing::Views;

// Each save here takes well under a second; before the fix they hung.
constexpr absl::Duration kDeadline = absl::Seconds(20);

// Drives `ShardOutputs` like the persister does, with "files" in memory and
// writes that complete only when waited for.
class FakeWriter {
 public:
  explicit FakeWriter(size_t shards) : files_(shards) {}

  void Attach(ShardOutputs* outputs) { outputs_ = outputs; }

  ShardOutputs::EmitFn emit() {
    return [this](size_t shard, uint64_t offset, size_t buffer, size_t bytes) -> absl::Status {
      EXPECT_EQ(offset % internal::kRecordAlignment, 0u) << "unaligned write offset";
      EXPECT_EQ(bytes % internal::kRecordAlignment, 0u) << "unaligned write length";
      std::string& file = files_[shard];
      if (file.size() < offset + bytes) file.resize(offset + bytes, '\xEE');
      std::memcpy(file.data() + offset, outputs_->buffer(buffer), bytes);
      in_flight_.push_back(buffer);
      ++writes_;
      return absl::OkStatus();
    };
  }

  ShardOutputs::WaitFn wait() {
    return [this]() -> absl::StatusOr<bool> {
      if (in_flight_.empty()) return false;
      outputs_->Release(in_flight_.front());
      in_flight_.pop_front();
      return true;
    };
  }

  // Completes every write (the persister's final drain).
  void Drain() {
    while (!in_flight_.empty()) {
      outputs_->Release(in_flight_.front());
      in_flight_.pop_front();
    }
  }

  const std::string& file(size_t shard) const { return files_[shard]; }
  size_t writes() const { return writes_; }

 private:
  ShardOutputs* outputs_ = nullptr;
  std::vector<std::string> files_;
  std::deque<size_t> in_flight_;
  size_t writes_ = 0;
};

struct ShardOutputsCase {
  size_t shards;
  size_t buffers;
  size_t buffer_bytes;
};

class ShardOutputsTest : public ::testing::TestWithParam<ShardOutputsCase> {};

// Records of random sizes appended to shards in a random interleaving, so
// every buffer ends up held by a partly filled shard again and again.
TEST_P(ShardOutputsTest, InterleavedShardsProduceExactFilesWithAnyBufferCount) {
  const ShardOutputsCase c = GetParam();
  FakeWriter writer(c.shards);
  auto outputs = ShardOutputs::Create(c.shards, c.buffer_bytes, c.buffers, writer.emit(),
                                      writer.wait());
  ASSERT_TRUE(outputs.ok()) << outputs.status();
  writer.Attach(outputs->get());

  std::mt19937_64 rng(c.shards * 1000 + c.buffers);
  std::vector<std::string> want(c.shards);
  std::vector<std::vector<uint64_t>> record_offsets(c.shards);
  for (int op = 0; op < 400; ++op) {
    const size_t shard = rng() % c.shards;
    if (rng() % 3 == 0) {
      auto offset = (*outputs)->BeginRecord(shard);
      ASSERT_TRUE(offset.ok()) << offset.status();
      want[shard].resize(AlignUp(want[shard].size(), internal::kRecordAlignment), '\0');
      ASSERT_EQ(*offset, want[shard].size());
      record_offsets[shard].push_back(*offset);
    }
    // From a few bytes to more than a buffer.
    std::string bytes(rng() % (c.buffer_bytes + c.buffer_bytes / 2) + 1, '\0');
    for (char& b : bytes) b = static_cast<char>(rng());
    ASSERT_TRUE((*outputs)->Append(shard, bytes.data(), bytes.size()).ok());
    want[shard] += bytes;
  }
  for (size_t s = 0; s < c.shards; ++s) {
    auto layout = (*outputs)->FinishShard(s);
    ASSERT_TRUE(layout.ok()) << layout.status();
    EXPECT_EQ(layout->file_bytes, want[s].size()) << "shard " << s;
    EXPECT_EQ(layout->padded_bytes, AlignUp(want[s].size(), internal::kRecordAlignment)) << "shard " << s;
    // Finishing again changes nothing.
    auto again = (*outputs)->FinishShard(s);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->padded_bytes, layout->padded_bytes);
  }
  writer.Drain();
  for (size_t s = 0; s < c.shards; ++s) {
    std::string padded = want[s];
    padded.resize(AlignUp(padded.size(), internal::kRecordAlignment), '\0');
    ASSERT_EQ(writer.file(s).size(), padded.size()) << "shard " << s;
    EXPECT_TRUE(writer.file(s) == padded) << "shard " << s << " differs";
  }
  if (c.shards > c.buffers) EXPECT_GT((*outputs)->spills(), 0u);
}

INSTANTIATE_TEST_SUITE_P(
    BufferCounts, ShardOutputsTest,
    ::testing::Values(ShardOutputsCase{1, 1, 4096}, ShardOutputsCase{9, 8, 16384},
                      ShardOutputsCase{40, 8, 8192}, ShardOutputsCase{40, 1, 4096},
                      ShardOutputsCase{40, 2, 65536}, ShardOutputsCase{3, 5, 4096}),
    [](const auto& info) {
      return absl::StrCat(info.param.shards, "shards_", info.param.buffers, "buffers_",
                          info.param.buffer_bytes, "B");
    });

TEST(ShardOutputsTest, RejectsZeroBuffers) {
  FakeWriter writer(1);
  EXPECT_FALSE(ShardOutputs::Create(1, 4096, 0, writer.emit(), writer.wait()).ok());
  EXPECT_FALSE(ShardOutputs::Create(1, 1000, 1, writer.emit(), writer.wait()).ok());
}

// --- Through the engine ---

struct EncodedCase {
  const char* name;
  DeltaOptions::Mode delta;
  int compression;
  size_t encode_buffers;
};

class ManyShardsTest : public ::testing::TestWithParam<EncodedCase> {};

// 40 shard files (one per module) of a few records each; before the fix
// every delta or zstd save with more than 8 shards hung.
std::vector<OwnedTensor> ManyModules(uint64_t seed) {
  std::vector<OwnedTensor> state;
  for (int m = 0; m < 40; ++m) {
    const std::string p = absl::StrCat("blocks.", m);
    state.push_back(RandomTensor(p + ".weight", DType::kFloat32, {64, 100 + m}, seed * 97 + m));
    state.push_back(RandomTensor(p + ".bias", DType::kBFloat16, {100 + m}, seed * 89 + m));
  }
  return state;
}

void Perturb(std::vector<OwnedTensor>& state, uint64_t seed, bool dense) {
  std::mt19937_64 rng(seed);
  for (OwnedTensor& t : state) {
    if (!dense && rng() % 4 != 0) continue;
    for (size_t i = 0; i < t.bytes.size(); i += dense ? 1 : 97) t.bytes[i] ^= rng() & 0x3;
  }
}

TEST_P(ManyShardsTest, EverySaveCommitsAndRestores) {
  const EncodedCase c = GetParam();
  ScratchDir dir;
  EngineOptions options = testing::SmallChunks();
  options.shard_min_bytes = 0;
  options.shard_max_bytes = 64 << 10;
  options.delta.mode = c.delta;
  options.delta.full_every = 4;
  options.delta.topk_ratio = 0.05;
  options.compression_level = c.compression;
  options.io.encode_buffers = c.encode_buffers;
  auto engine = Engine::Open(dir.Join("root"), options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::vector<OwnedTensor> state = ManyModules(1);
  std::map<int64_t, std::vector<OwnedTensor>> saved;
  for (int64_t step = 1; step <= 5; ++step) {
    auto handle = (*engine)->SaveAsync(step, Views(state));
    ASSERT_TRUE(handle.ok()) << handle.status();
    const std::string what = absl::StrCat(c.name, ": save of step ", step);
    ASSERT_TRUE(testing::WaitOrDie(**handle, kDeadline, what).ok()) << what;
    EXPECT_GE((*handle)->stats().shard_count, 40u);
    saved[step] = state;
    Perturb(state, step, /*dense=*/step % 2 == 0);
  }
  ASSERT_TRUE((*engine)->Close(Engine::CloseMode::kWait).ok());
  if (c.delta == DeltaOptions::Mode::kTopK) {
    std::map<int64_t, testing::RestoredStep> restored;
    EXPECT_EQ(testing::ReadAllSteps(dir.Join("root"), &restored), "");
    EXPECT_EQ(restored.size(), saved.size());
    return;
  }
  for (const auto& [step, want] : saved) testing::ExpectCheckpointEquals(dir.Join("root"), step, want);
}

INSTANTIATE_TEST_SUITE_P(
    Modes, ManyShardsTest,
    ::testing::Values(EncodedCase{"exact", DeltaOptions::Mode::kExact, 0, 8},
                      EncodedCase{"exact_1buf", DeltaOptions::Mode::kExact, 0, 1},
                      EncodedCase{"topk", DeltaOptions::Mode::kTopK, 0, 8},
                      EncodedCase{"topk_2buf", DeltaOptions::Mode::kTopK, 0, 2},
                      EncodedCase{"zstd", DeltaOptions::Mode::kNone, 1, 8},
                      EncodedCase{"zstd_1buf", DeltaOptions::Mode::kNone, 3, 1},
                      EncodedCase{"zstd_exact", DeltaOptions::Mode::kExact, 1, 8},
                      EncodedCase{"zstd_exact_1buf", DeltaOptions::Mode::kExact, 1, 1}),
    [](const auto& info) { return std::string(info.param.name); });

// The report's second symptom: zstd with staging memory smaller than the
// state made `SaveAsync` itself wait for chunks the stuck persister held.
TEST(ManyShardsTest, CompressedSaveLargerThanStagingMemoryReturns) {
  ScratchDir dir;
  EngineOptions options = testing::SmallChunks();
  options.shard_min_bytes = 0;
  options.shard_max_bytes = 64 << 10;
  options.compression_level = 1;
  options.staging_bytes = 4 * options.io.chunk_bytes;
  auto engine = Engine::Open(dir.Join("root"), options);
  ASSERT_TRUE(engine.ok());
  std::vector<OwnedTensor> state = ManyModules(2);
  std::shared_ptr<SaveHandle> handle;
  testing::RunOrDie(
      [&] {
        auto h = (*engine)->SaveAsync(7, Views(state));
        ASSERT_TRUE(h.ok()) << h.status();
        handle = *h;
      },
      kDeadline, "SaveAsync of a zstd save larger than staging memory");
  ASSERT_NE(handle, nullptr);
  ASSERT_TRUE(testing::WaitOrDie(*handle, kDeadline, "zstd save larger than staging").ok());
  ASSERT_TRUE((*engine)->Close(Engine::CloseMode::kWait).ok());
  testing::ExpectCheckpointEquals(dir.Join("root"), 7, state);
}

TEST(ManyShardsTest, ZeroEncodeBuffersIsRejectedAtOpen) {
  ScratchDir dir;
  EngineOptions options;
  options.io.encode_buffers = 0;
  auto engine = Engine::Open(dir.Join("root"), options);
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(engine.status().message().find("encode_buffers"), std::string::npos);
}

}  // namespace
}  // namespace ckpt
