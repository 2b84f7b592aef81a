#include "engine/save_manifest.h"

namespace ckpt::internal {
namespace {

// What tensor `t` is, and its checksum.
void Describe(const TensorView& t, uint64_t hash, bool multi_rank, TensorInfo* info) {
  info->name = t.name;
  info->dtype = t.dtype;
  info->shape = t.shape;
  info->raw_bytes = t.nbytes;
  info->xxh3 = hash;
  if (multi_rank) info->placement = t.placement;
  if (info->placement == TensorPlacement::kSharded) {
    info->global_shape = t.global_shape;
    info->global_offset = t.global_offset;
  }
}

}  // namespace

Manifest BuildSaveManifest(int64_t step, std::span<const TensorView> tensors,
                           std::span<const PlannedShard> plan, const WrittenRecords& written,
                           bool multi_rank, const std::optional<DeltaBase>& delta) {
  const bool encoded = !written.records.empty();
  Manifest manifest;
  manifest.step = step;
  manifest.tensors.resize(tensors.size());
  for (size_t i = 0; i < plan.size(); ++i) {
    const PlannedShard& shard = plan[i];
    const uint64_t file_bytes = encoded ? written.shards[i].file_bytes : shard.file_bytes;
    for (const PlannedRecord& r : shard.records) {
      Describe(tensors[r.tensor], written.hashes[r.tensor], multi_rank, &manifest.tensors[r.tensor]);
    }
    PlaceRawRecords(shard, file_bytes, &manifest);
    for (const PlannedRecord& r : shard.records) {
      TensorInfo& info = manifest.tensors[r.tensor];
      // An encoded record lies where the encoder put it, as it was encoded.
      if (encoded) {
        const RecordLayout& rl = written.records[r.tensor];
        info.offset = rl.offset;
        info.stored_bytes = rl.stored_bytes;
        info.encoding = rl.encoding;
        info.error_bound = rl.error_bound;
        info.stored_xxh3 = rl.stored_xxh3;
        if (written.restored_hashes[r.tensor] != 0) info.xxh3 = written.restored_hashes[r.tensor];
      }
      // Block hashes describe bytes stored as they are: only a raw record's.
      if (r.tensor < written.block_bytes.size() && written.block_bytes[r.tensor] != 0 &&
          info.encoding == RecordEncoding::kRaw) {
        info.block_bytes = written.block_bytes[r.tensor];
        info.block_xxh3 = written.block_hashes[r.tensor];
      }
    }
  }
  bool any_delta = false;
  for (const TensorInfo& t : manifest.tensors) any_delta |= IsDeltaEncoding(t.encoding);
  if (delta.has_value() && any_delta) {
    manifest.kind = CheckpointKind::kDelta;
    manifest.base_step = delta->step;
    manifest.base_manifest_xxh3 = delta->manifest_xxh3;
    manifest.delta_mode = delta->mode;
  }
  return manifest;
}

}  // namespace ckpt::internal
