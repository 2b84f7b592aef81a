// Sharded tensors (TensorPlacement::kSharded): ranks save chunks of global
// tensors, and any box of a global tensor reads back bit-exact — whatever
// the reader's own layout — reading only the chunks and blocks it overlaps,
// checked block by block.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ckpt/catalog.h"
#include "ckpt/distributed.h"
#include "ckpt/engine.h"
#include "ckpt/reader.h"
#include "distributed_ranks.h"
#include "gtest/gtest.h"
#include "format/manifest.h"
#include "read/region_box.h"
#include "test_util.h"

namespace ckpt {
namespace {

using internal::Box;
using testing::OwnedTensor;
using testing::RandomTensor;
using testing::Ranks;
using testing::ScratchDir;

// The even split of `size` into `parts` pieces that DTensor's Shard(dim)
// uses: ceil(size / parts) each, the last ones short or empty.
std::pair<int64_t, int64_t> ShardRange(int64_t size, int parts, int index) {
  const int64_t per = (size + parts - 1) / parts;
  const int64_t from = std::min(size, per * index);
  return {from, std::min(size, from + per) - from};
}

// Rank `r`'s chunk of `global` sharded `parts` ways along `dim`.
Box ChunkBox(const std::vector<int64_t>& global, int dim, int parts, int r) {
  Box box{std::vector<int64_t>(global.size(), 0), global};
  auto [from, size] = ShardRange(global[dim], parts, r);
  box.offset[dim] = from;
  box.shape[dim] = size;
  return box;
}

// Copies `box` out of the row-major `global` tensor of `shape`.
std::vector<uint8_t> Slice(const OwnedTensor& global, const Box& box) {
  const Box whole{std::vector<int64_t>(global.shape.size(), 0), global.shape};
  const uint64_t element = DTypeSize(global.dtype);
  std::vector<uint8_t> out(box.elements() * element);
  internal::ForEachRun(box, whole, box, [&](uint64_t from, uint64_t to, uint64_t n) {
    std::memcpy(out.data() + to * element, global.bytes.data() + from * element, n * element);
  });
  return out;
}

// A global tensor and how it is sharded on save.
struct Sharded {
  OwnedTensor global;
  int dim = 0;
};

std::vector<Sharded> ModelLikeState(uint64_t seed) {
  return {
      {RandomTensor("embed.weight", DType::kFloat32, {1024, 384}, seed + 1), 0},  // 1.5 MiB: blocks
      {RandomTensor("block.0.w", DType::kBFloat16, {13, 7}, seed + 2), 0},       // uneven
      {RandomTensor("block.0.b", DType::kInt64, {5}, seed + 3), 0},              // one rank empty
      {RandomTensor("block.1.w", DType::kFloat16, {6, 10, 5}, seed + 4), 1},     // Shard(1)
      {RandomTensor("step", DType::kInt32, {}, seed + 5), 0},                    // a scalar, one chunk
      {RandomTensor("mask", DType::kBool, {9, 3}, seed + 6), 1},
  };
}

// Rank `r`'s views of `state` as `world` ranks shard it (a scalar is saved
// by rank 0 alone).
std::vector<TensorView> RankViews(const std::vector<Sharded>& state, int world, int r,
                                  std::vector<std::vector<uint8_t>>& storage) {
  std::vector<TensorView> views;
  for (const Sharded& s : state) {
    Box box = s.global.shape.empty() ? Box{} : ChunkBox(s.global.shape, s.dim, world, r);
    if (s.global.shape.empty() && r != 0) continue;
    storage.push_back(Slice(s.global, box));
    TensorView v;
    v.name = s.global.name;
    v.dtype = s.global.dtype;
    v.shape = box.shape;
    v.data = storage.back().data();
    v.nbytes = storage.back().size();
    v.placement = TensorPlacement::kSharded;
    v.global_shape = s.global.shape;
    v.global_offset = box.offset;
    views.push_back(std::move(v));
  }
  return views;
}

// Every rank saves `step` of its `views[r]`; returns each one's outcome.
std::vector<absl::Status> SaveAll(Ranks& ranks, int64_t step, const std::vector<std::vector<TensorView>>& views) {
  std::vector<absl::Status> outcome(ranks.world());
  Ranks::Parallel(ranks.world(), [&](int r) {
    auto handle = ranks.engine(r).SaveAsync(step, views[r]);
    outcome[r] = handle.ok() ? testing::WaitOrDie(**handle, testing::kRankDeadline, absl::StrCat("rank ", r))
                             : handle.status();
  });
  return outcome;
}

void SaveState(Ranks& ranks, int64_t step, const std::vector<Sharded>& state) {
  std::vector<std::vector<std::vector<uint8_t>>> storage(ranks.world());
  std::vector<std::vector<TensorView>> views;
  for (int r = 0; r < ranks.world(); ++r) views.push_back(RankViews(state, ranks.world(), r, storage[r]));
  std::vector<absl::Status> outcome = SaveAll(ranks, step, views);
  for (int r = 0; r < ranks.world(); ++r) ASSERT_TRUE(outcome[r].ok()) << "rank " << r << ": " << outcome[r];
}

// Reads `box` of tensor `name` and expects exactly those elements of `global`.
void ExpectRegion(Reader& reader, const OwnedTensor& global, const Box& box) {
  std::vector<uint8_t> got(box.elements() * DTypeSize(global.dtype) + 1, 0xEE);
  RegionTarget target{global.name, box.offset, box.shape, got.data(), got.size()};
  ASSERT_TRUE(reader.ReadRegions({&target, 1}).ok()) << global.name;
  got.pop_back();
  EXPECT_EQ(got, Slice(global, box)) << global.name << " box at " << absl::StrJoin(box.offset, ",");
}

TEST(RegionBox, RunsCopyABoxBetweenLayouts) {
  const Box outer{{0, 0, 0}, {4, 5, 6}};
  EXPECT_TRUE(internal::IsContiguousIn(Box{{1, 0, 0}, {2, 5, 6}}, outer));
  EXPECT_TRUE(internal::IsContiguousIn(Box{{1, 2, 0}, {1, 3, 6}}, outer));
  EXPECT_FALSE(internal::IsContiguousIn(Box{{1, 2, 0}, {2, 3, 6}}, outer));
  EXPECT_FALSE(internal::IsContiguousIn(Box{{0, 0, 1}, {4, 5, 2}}, outer));
  EXPECT_FALSE(internal::Intersect(Box{{0}, {3}}, Box{{3}, {2}}).has_value());
  EXPECT_EQ(*internal::Intersect(Box{{0, 2}, {3, 4}}, Box{{1, 0}, {5, 3}}), (Box{{1, 2}, {2, 1}}));
  // A [2, 3] box of a [4, 5] source into a [3, 4] destination: two runs of three.
  std::vector<std::tuple<uint64_t, uint64_t, uint64_t>> runs;
  internal::ForEachRun(Box{{1, 1}, {2, 3}}, Box{{0, 0}, {4, 5}}, Box{{1, 0}, {3, 4}},
                       [&](uint64_t from, uint64_t to, uint64_t n) { runs.emplace_back(from, to, n); });
  EXPECT_EQ(runs, (std::vector<std::tuple<uint64_t, uint64_t, uint64_t>>{{6, 1, 3}, {11, 5, 3}}));
  runs.clear();
  internal::ForEachRun(Box{}, Box{}, Box{}, [&](uint64_t f, uint64_t t, uint64_t n) { runs.emplace_back(f, t, n); });
  EXPECT_EQ(runs.size(), 1u);
}

class ShardedTensorTest : public ::testing::TestWithParam<int> {};

// Saved on `world` ranks; read back whole and as every other layout:
// 1..4 ranks sharding each dimension, and boxes of odd sizes.
TEST_P(ShardedTensorTest, AnyBoxReadsBackBitExactFromAnyLayout) {
  const int world = GetParam();
  ScratchDir dir;
  const std::string root = dir.Join("root");
  Ranks ranks(root, world, testing::SmallChunks(), absl::Seconds(20));
  const std::vector<Sharded> state = ModelLikeState(11);
  SaveState(ranks, 1, state);
  ranks.CloseAll();

  for (std::optional<int> view_rank : {std::optional<int>(), std::optional<int>(world - 1)}) {
    ReaderOptions options;
    options.rank = view_rank;
    auto reader = Reader::Open(root, options);
    ASSERT_TRUE(reader.ok()) << reader.status();
    for (const Sharded& s : state) {
      const TensorInfo* info = (*reader)->Find(s.global.name);
      ASSERT_NE(info, nullptr) << s.global.name;
      EXPECT_EQ(info->placement, TensorPlacement::kSharded);
      EXPECT_EQ(info->shape, s.global.shape);
      EXPECT_EQ(info->raw_bytes, s.global.bytes.size());
      EXPECT_EQ(info->chunks.size(), s.global.shape.empty() ? 1u : static_cast<size_t>(world));
      auto whole = (*reader)->Read(s.global.name);
      ASSERT_TRUE(whole.ok()) << whole.status();
      EXPECT_EQ(std::memcmp(whole->data(), s.global.bytes.data(), s.global.bytes.size()), 0) << s.global.name;
      if (s.global.shape.empty()) continue;
      for (int readers = 1; readers <= 4; ++readers) {
        for (int dim = 0; dim < static_cast<int>(s.global.shape.size()); ++dim) {
          for (int r = 0; r < readers; ++r) ExpectRegion(**reader, s.global, ChunkBox(s.global.shape, dim, readers, r));
        }
      }
      std::mt19937_64 rng(5);
      for (int i = 0; i < 10; ++i) {
        Box box;
        for (int64_t d : s.global.shape) {
          const int64_t from = static_cast<int64_t>(rng() % d);
          box.offset.push_back(from);
          box.shape.push_back(1 + static_cast<int64_t>(rng() % (d - from)));
        }
        ExpectRegion(**reader, s.global, box);
      }
    }
    EXPECT_TRUE((*reader)->Verify().ok());
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, ShardedTensorTest, ::testing::Values(2, 4),
                         [](const auto& info) { return absl::StrCat(info.param, "Ranks"); });

// A reader resharding 4 ranks' Shard(0) chunks onto 3 reads the bytes it
// needs, rounded out to blocks: the chunks it overlaps, not whole files.
TEST(ShardedTensor, ReadingARegionReadsOnlyTheBlocksItOverlaps) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  Ranks ranks(root, 4, testing::SmallChunks(), absl::Seconds(20));
  const std::vector<Sharded> state = {{RandomTensor("w", DType::kFloat32, {8192, 512}, 3), 0}};  // 16 MiB
  SaveState(ranks, 1, state);
  ranks.CloseAll();
  const uint64_t total = state[0].global.bytes.size();
  uint64_t read_by_all = 0;
  for (int r = 0; r < 3; ++r) {
    auto reader = Reader::Open(root, ReaderOptions{});
    ASSERT_TRUE(reader.ok()) << reader.status();
    const uint64_t before = (*reader)->bytes_read();
    const Box box = ChunkBox(state[0].global.shape, 0, 3, r);
    ExpectRegion(**reader, state[0].global, box);
    const uint64_t needed = box.elements() * 4;
    const uint64_t read = (*reader)->bytes_read() - before;
    EXPECT_GE(read, needed);
    EXPECT_LE(read, needed + 2 * internal::kBlockBytes) << "rank " << r;
    read_by_all += read;
  }
  EXPECT_LE(read_by_all, total * 105 / 100);
  // One column slab: every row is needed in part, so every block is read,
  // but nothing twice.
  auto reader = Reader::Open(root, ReaderOptions{});
  ASSERT_TRUE(reader.ok());
  ExpectRegion(**reader, state[0].global, Box{{0, 0}, {8192, 256}});
  EXPECT_LE((*reader)->bytes_read(), total);
}

TEST(ShardedTensor, ADamagedBlockFailsOnlyTheRegionsThatReadIt) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  Ranks ranks(root, 2, testing::SmallChunks(), absl::Seconds(20));
  const std::vector<Sharded> state = {{RandomTensor("w", DType::kFloat32, {2048, 256}, 9), 0}};  // 2 MiB
  SaveState(ranks, 1, state);
  ranks.CloseAll();
  // Flip a byte in rank 1's chunk, 600 KiB in: its third block.
  std::string shard;
  for (const auto& e : std::filesystem::recursive_directory_iterator(root)) {
    if (absl::StrContains(e.path().filename().string(), "rank-00001.") && absl::EndsWith(e.path().string(), ".shard")) {
      shard = e.path().string();
    }
  }
  ASSERT_FALSE(shard.empty());
  auto reader = Reader::Open(root, ReaderOptions{});
  ASSERT_TRUE(reader.ok()) << reader.status();
  const TensorInfo* info = (*reader)->Find("w");
  ASSERT_NE(info, nullptr);
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    // The chunk is the shard's only record: it starts at 0.
    f.seekp(600 * 1024);
    char c = 0;
    f.read(&c, 1);
    c ^= 0x5A;
    f.seekp(600 * 1024);
    f.write(&c, 1);
  }
  // Rows 1024.. are rank 1's; row 1024 + 600 KiB / 1 KiB = 1624 holds the byte.
  ExpectRegion(**reader, state[0].global, Box{{1024, 0}, {256, 256}});  // its first block only
  std::vector<uint8_t> buffer(256 * 256 * 4);
  RegionTarget damaged{"w", {1600, 0}, {50, 256}, buffer.data(), buffer.size()};
  absl::Status s = (*reader)->ReadRegions({&damaged, 1});
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "w (block 2)")) << s;
  EXPECT_EQ((*reader)->Verify().code(), absl::StatusCode::kDataLoss);
}

TEST(ShardedTensor, DeltasAndCompressionWorkPerChunk) {
  for (int compression : {0, 3}) {
    SCOPED_TRACE(absl::StrCat("zstd level ", compression));
    ScratchDir dir;
    const std::string root = dir.Join("root");
    EngineOptions options = testing::SmallChunks();
    options.delta.mode = DeltaOptions::Mode::kExact;
    options.compression_level = compression;
    Ranks ranks(root, 2, options, absl::Seconds(20));
    std::vector<Sharded> state = ModelLikeState(21);
    SaveState(ranks, 1, state);
    for (Sharded& s : state) s.global.bytes[s.global.bytes.size() / 2] ^= 0x11;  // a training step
    SaveState(ranks, 2, state);
    ranks.CloseAll();
    ReaderOptions options2;
    options2.step = 2;
    auto reader = Reader::Open(root, options2);
    ASSERT_TRUE(reader.ok()) << reader.status();
    for (const Sharded& s : state) {
      auto whole = (*reader)->Read(s.global.name);
      ASSERT_TRUE(whole.ok()) << whole.status();
      EXPECT_EQ(std::memcmp(whole->data(), s.global.bytes.data(), s.global.bytes.size()), 0) << s.global.name;
      if (s.global.shape.empty()) continue;
      for (int r = 0; r < 3; ++r) ExpectRegion(**reader, s.global, ChunkBox(s.global.shape, 0, 3, r));
    }
    if (compression == 0) {
      // The second save is a delta of the first, chunk by chunk.
      auto summaries = ListCheckpoints(root);
      ASSERT_TRUE(summaries.ok());
      EXPECT_EQ(summaries->back().kind, CheckpointKind::kDelta);
    }
  }
}

// Chunks that do not tile their tensor fail the save, naming it; nothing
// is committed.
TEST(ShardedTensor, ChunksThatDoNotTileTheTensorFailTheSave) {
  struct Case {
    const char* what;
    std::vector<int64_t> rank1_offset;
    std::vector<int64_t> rank1_shape;
    std::vector<int64_t> rank1_global;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"overlap", {3, 0}, {5, 4}, {8, 4}, "overlaps"},
      {"gap", {5, 0}, {3, 4}, {8, 4}, "elements"},
      {"global shapes differ", {4, 0}, {4, 4}, {9, 4}, "tensor on rank"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    ScratchDir dir;
    Ranks ranks(dir.Join("root"), 2, testing::SmallChunks(), absl::Seconds(20));
    std::vector<uint8_t> a(4 * 4 * 4), b(c.rank1_shape[0] * c.rank1_shape[1] * 4);
    TensorView v0{"w", DType::kFloat32, {4, 4}, a.data(), a.size()};
    v0.placement = TensorPlacement::kSharded;
    v0.global_shape = {8, 4};
    v0.global_offset = {0, 0};
    TensorView v1{"w", DType::kFloat32, c.rank1_shape, b.data(), b.size()};
    v1.placement = TensorPlacement::kSharded;
    v1.global_shape = c.rank1_global;
    v1.global_offset = c.rank1_offset;
    std::vector<absl::Status> outcome = SaveAll(ranks, 1, {{v0}, {v1}});
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(outcome[r].code(), absl::StatusCode::kInvalidArgument) << r << ": " << outcome[r];
    }
    EXPECT_TRUE(absl::StrContains(outcome[0].message(), "\"w\"")) << outcome[0];
    EXPECT_TRUE(absl::StrContains(outcome[0].message(), c.expect)) << outcome[0];
    ranks.CloseAll();
    auto summaries = ListCheckpoints(dir.Join("root"));
    ASSERT_TRUE(summaries.ok());
    EXPECT_TRUE(summaries->empty());
  }
}

TEST(ShardedTensor, SaveRefusesChunksOutsideTheirTensorAndPartsInOneProcess) {
  ScratchDir dir;
  auto engine = Engine::Open(dir.Join("root"), testing::SmallChunks());
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::vector<uint8_t> bytes(4 * 4 * 4);
  TensorView v{"w", DType::kFloat32, {4, 4}, bytes.data(), bytes.size()};
  v.placement = TensorPlacement::kSharded;
  v.global_shape = {8, 4};
  v.global_offset = {0, 0};
  auto refused = (*engine)->SaveAsync(1, {&v, 1});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "single-process")) << refused.status();
  v.global_offset = {6, 0};
  refused = (*engine)->SaveAsync(1, {&v, 1});
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "outside")) << refused.status();
  v.global_shape = {8};
  refused = (*engine)->SaveAsync(1, {&v, 1});
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "global_shape")) << refused.status();
  // The whole tensor is fine, and reads back as a plain one.
  v.global_shape = {4, 4};
  v.global_offset = {0, 0};
  auto saved = (*engine)->SaveAsync(1, {&v, 1});
  ASSERT_TRUE(saved.ok()) << saved.status();
  ASSERT_TRUE(testing::WaitOrDie(**saved, absl::Seconds(60), "save").ok());
  ASSERT_TRUE((*engine)->Close().ok());
  auto reader = Reader::Open(dir.Join("root"), ReaderOptions{});
  ASSERT_TRUE(reader.ok());
  std::vector<uint8_t> region(2 * 4 * 4);
  RegionTarget target{"w", {2, 0}, {2, 4}, region.data(), region.size()};
  ASSERT_TRUE((*reader)->ReadRegions({&target, 1}).ok());
  EXPECT_EQ(std::memcmp(region.data(), bytes.data() + 32, 32), 0);
  target.offset = {3, 0};
  EXPECT_EQ((*reader)->ReadRegions({&target, 1}).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ckpt
