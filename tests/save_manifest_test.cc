// BuildSaveManifest (engine/save_manifest.h): the manifest of a save from
// what writing it produced, without a disk.
#include "engine/save_manifest.h"

#include <vector>

#include <gtest/gtest.h>

#include "format/shard_plan.h"

namespace ckpt::internal {
namespace {

std::vector<TensorView> Layer() {
  std::vector<TensorView> tensors(3);
  tensors[0].name = "layers.0.attn.q.weight";
  tensors[0].shape = {64, 64};
  tensors[1].name = "layers.0.attn.q.bias";
  tensors[1].shape = {64};
  tensors[2].name = "layers.0.mlp.up.weight";
  tensors[2].shape = {256, 64};
  for (TensorView& t : tensors) {
    t.dtype = DType::kFloat32;
    t.nbytes = 4;
    for (int64_t d : t.shape) t.nbytes *= static_cast<size_t>(d);
  }
  return tensors;
}

TEST(SaveManifestTest, RawRecordsLieWherePlanned) {
  const std::vector<TensorView> tensors = Layer();
  const std::vector<PlannedShard> plan = PlanShards(tensors, 0, 1 << 20);
  const std::vector<uint64_t> hashes = {11, 22, 33};
  WrittenRecords written;
  written.hashes = hashes;
  const Manifest m = BuildSaveManifest(7, tensors, plan, written, false, std::nullopt);
  EXPECT_EQ(m.step, 7);
  EXPECT_EQ(m.kind, CheckpointKind::kFull);
  ASSERT_EQ(m.tensors.size(), 3u);
  ASSERT_EQ(m.shards.size(), plan.size());
  for (const PlannedShard& shard : plan) {
    for (const PlannedRecord& r : shard.records) {
      const TensorInfo& t = m.tensors[r.tensor];
      EXPECT_EQ(t.name, tensors[r.tensor].name);
      EXPECT_EQ(t.shard, shard.file);
      EXPECT_EQ(t.offset, r.offset);
      EXPECT_EQ(t.stored_bytes, t.raw_bytes);
      EXPECT_EQ(t.encoding, RecordEncoding::kRaw);
      EXPECT_EQ(t.xxh3, hashes[r.tensor]);
      EXPECT_EQ(t.placement, TensorPlacement::kDefault);  // single process: not recorded
    }
  }
}

TEST(SaveManifestTest, EncodedRecordsAndDeltaBase) {
  const std::vector<TensorView> tensors = Layer();
  const std::vector<PlannedShard> plan = PlanShards(tensors, 1 << 20, 1 << 20);  // one shard
  ASSERT_EQ(plan.size(), 1u);
  const std::vector<uint64_t> hashes = {1, 2, 3};
  const std::vector<ShardLayout> shards = {ShardLayout{5000, 8192}};
  std::vector<RecordLayout> records(3);
  records[0] = RecordLayout{0, 1000, RecordEncoding::kXorPlanes, 0, 0xabc};
  records[1] = RecordLayout{1000, 256, RecordEncoding::kRaw, 0, std::nullopt};
  records[2] = RecordLayout{1256, 3744, RecordEncoding::kTopK, 0.5, 0xdef};
  const std::vector<uint64_t> restored = {0, 0, 99};
  WrittenRecords written;
  written.hashes = hashes;
  written.shards = shards;
  written.records = records;
  written.restored_hashes = restored;
  const Manifest m = BuildSaveManifest(9, tensors, plan, written, false,
                                       DeltaBase{4, 0x1234, DeltaOptions::Mode::kTopK});
  EXPECT_EQ(m.kind, CheckpointKind::kDelta);
  EXPECT_EQ(m.base_step, 4);
  EXPECT_EQ(m.base_manifest_xxh3, 0x1234u);
  EXPECT_EQ(m.delta_mode, DeltaOptions::Mode::kTopK);
  EXPECT_EQ(m.shards[0].bytes, 5000u);
  EXPECT_EQ(m.tensors[0].encoding, RecordEncoding::kXorPlanes);
  EXPECT_EQ(m.tensors[0].stored_bytes, 1000u);
  EXPECT_EQ(m.tensors[0].stored_xxh3, 0xabcu);
  EXPECT_EQ(m.tensors[0].xxh3, 1u);
  EXPECT_EQ(m.tensors[1].offset, 1000u);
  EXPECT_EQ(m.tensors[2].error_bound, 0.5);
  EXPECT_EQ(m.tensors[2].xxh3, 99u);  // top-k: what a restore yields
}

TEST(SaveManifestTest, ADeltaOfWholeRecordsIsFull) {
  const std::vector<TensorView> tensors = Layer();
  const std::vector<PlannedShard> plan = PlanShards(tensors, 1 << 20, 1 << 20);
  const std::vector<uint64_t> hashes = {1, 2, 3};
  const std::vector<ShardLayout> shards = {ShardLayout{plan[0].file_bytes, plan[0].padded_bytes}};
  std::vector<RecordLayout> records(3);
  for (const PlannedRecord& r : plan[0].records) records[r.tensor] = RecordLayout{r.offset, r.bytes};
  const std::vector<uint64_t> restored(3, 0);
  WrittenRecords written;
  written.hashes = hashes;
  written.shards = shards;
  written.records = records;
  written.restored_hashes = restored;
  const Manifest m = BuildSaveManifest(9, tensors, plan, written, false,
                                       DeltaBase{4, 0x1234, DeltaOptions::Mode::kExact});
  EXPECT_EQ(m.kind, CheckpointKind::kFull);
  EXPECT_EQ(m.base_step, Manifest{}.base_step);  // no base
}

TEST(SaveManifestTest, MultiRankRecordsPlacementAndBlockHashesOfRawRecords) {
  std::vector<TensorView> tensors = Layer();
  tensors[2].placement = TensorPlacement::kSharded;
  tensors[2].global_shape = {512, 64};
  tensors[2].global_offset = {256, 0};
  tensors[1].placement = TensorPlacement::kReplicated;
  const std::vector<PlannedShard> plan = PlanShards(tensors, 0, 1 << 20);
  const std::vector<uint64_t> hashes = {1, 2, 3};
  const std::vector<uint64_t> block_bytes = {0, 0, 32768};
  const std::vector<std::vector<uint64_t>> block_hashes = {{}, {}, {7, 8}};
  WrittenRecords written;
  written.hashes = hashes;
  written.block_bytes = block_bytes;
  written.block_hashes = block_hashes;
  const Manifest m = BuildSaveManifest(3, tensors, plan, written, true, std::nullopt);
  EXPECT_EQ(m.tensors[1].placement, TensorPlacement::kReplicated);
  EXPECT_EQ(m.tensors[2].placement, TensorPlacement::kSharded);
  EXPECT_EQ(m.tensors[2].global_shape, tensors[2].global_shape);
  EXPECT_EQ(m.tensors[2].global_offset, tensors[2].global_offset);
  EXPECT_EQ(m.tensors[2].block_bytes, 32768u);
  EXPECT_EQ(m.tensors[2].block_xxh3, block_hashes[2]);
  EXPECT_EQ(m.tensors[0].block_bytes, 0u);
}

}  // namespace
}  // namespace ckpt::internal
