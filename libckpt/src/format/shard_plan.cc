#include "format/shard_plan.h"

#include "absl/strings/string_view.h"
#include "absl/container/flat_hash_map.h"

#include "absl/strings/str_cat.h"
#include "format/manifest.h"
#include "format/names.h"
#include "ckpt/file_system.h"

namespace ckpt::internal {
namespace {


}  // namespace

std::vector<PlannedShard> PlanShards(std::span<const TensorView> tensors, uint64_t min_bytes,
                                     uint64_t max_bytes) {
  // Modules in order of first appearance.
  std::vector<std::vector<size_t>> modules;
  absl::flat_hash_map<absl::string_view, size_t> module_index;
  for (size_t i = 0; i < tensors.size(); ++i) {
    auto [it, inserted] = module_index.emplace(ModuleOf(tensors[i].name), modules.size());
    if (inserted) modules.emplace_back();
    modules[it->second].push_back(i);
  }

  std::vector<PlannedShard> shards;
  auto open_shard = [&](size_t first_tensor) {
    PlannedShard shard;
    shard.file = absl::StrCat(SanitizeFileNamePart(ModuleOf(tensors[first_tensor].name)), ".",
                              shards.size(), ".shard");
    shards.push_back(std::move(shard));
  };
  for (const std::vector<size_t>& module : modules) {
    // A new module starts a new shard once the current one is big enough.
    if (shards.empty() || shards.back().padded_bytes >= min_bytes) open_shard(module.front());
    for (size_t t : module) {
      const uint64_t bytes = tensors[t].nbytes;
      PlannedShard* shard = &shards.back();
      if (!shard->records.empty() && shard->padded_bytes + bytes > max_bytes) {
        open_shard(t);
        shard = &shards.back();
      }
      shard->records.push_back(PlannedRecord{t, shard->padded_bytes, bytes});
      shard->file_bytes = shard->padded_bytes + bytes;
      shard->padded_bytes = AlignUp(shard->file_bytes, kRecordAlignment);
    }
  }
  return shards;
}

}  // namespace ckpt::internal
