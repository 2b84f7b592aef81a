#include "format/json_forms.h"

#include "ckpt/json.h"
#include "util/hash.h"

namespace ckpt {
namespace internal {

nlohmann::ordered_json SaveStatsObject(const SaveStats& s) {
  nlohmann::ordered_json j;
  j["step"] = s.step;
  j["dir"] = s.dir;
  j["skipped"] = s.skipped;
  if (s.kind.has_value()) {
    j["kind"] = std::string(CheckpointKindName(*s.kind));
  } else {
    j["kind"] = nullptr;  // not committed
  }
  j["tensor_bytes"] = s.tensor_bytes;
  j["file_bytes"] = s.file_bytes;
  j["tensor_count"] = s.tensor_count;
  j["shard_count"] = s.shard_count;
  j["blocked_s"] = s.blocked_s;
  j["blocked_cpu_s"] = s.blocked_cpu_s;
  j["staging_s"] = s.staging_s;
  j["staging_wait_s"] = s.staging_wait_s;
  j["staging_memory"] = s.staging_memory;
  j["persist_s"] = s.persist_s;
  j["seconds"] = s.seconds;
  j["persist_gbps"] = s.persist_gbps;
  j["backend"] = s.backend;
  if (s.world_size > 1) {
    j["rank"] = s.rank;
    j["world_size"] = s.world_size;
    j["ranks_wait_s"] = s.ranks_wait_s;
    j["commit_latency_s"] = s.commit_latency_s;
  }
  return j;
}

nlohmann::ordered_json EngineStatsObject(const EngineStats& s) {
  nlohmann::ordered_json j;
  j["saves_started"] = s.saves_started;
  j["saves_committed"] = s.saves_committed;
  j["saves_failed"] = s.saves_failed;
  j["saves_skipped"] = s.saves_skipped;
  j["bytes_committed"] = s.bytes_committed;
  j["watchdog_stalls"] = s.watchdog_stalls;
  j["saves_given_up"] = s.saves_given_up;
  j["saves_in_flight"] = s.saves_in_flight;
  j["staging_bytes"] = s.staging_bytes;
  j["staging_bytes_free"] = s.staging_bytes_free;
  j["staging_memory"] = s.staging_memory;
  j["saves_staged_unpinned"] = s.saves_staged_unpinned;
  j["backend"] = s.backend;
  j["last"] = SaveStatsObject(s.last);
  return j;
}

nlohmann::ordered_json TensorInfoObject(const TensorInfo& t) {
  nlohmann::ordered_json j = {{"name", t.name},
                              {"dtype", std::string(DTypeName(t.dtype))},
                              {"shape", t.shape},
                              {"shard", t.shard},
                              {"offset", t.offset},
                              {"raw_bytes", t.raw_bytes},
                              {"stored_bytes", t.stored_bytes},
                              {"encoding", std::string(RecordEncodingName(t.encoding))},
                              {"xxh3", HashToHex(t.xxh3)},
                              {"error_bound", t.error_bound}};
  if (t.stored_xxh3.has_value()) j["stored_xxh3"] = HashToHex(*t.stored_xxh3);
  // Only a multi-rank checkpoint's tensors have a placement or rank to say.
  if (t.placement != TensorPlacement::kDefault) {
    j["placement"] = std::string(TensorPlacementName(t.placement));
  }
  if (t.placement != TensorPlacement::kDefault || t.rank != 0) j["rank"] = t.rank;
  if (t.placement == TensorPlacement::kSharded) {
    j["global_shape"] = t.global_shape;
    j["global_offset"] = t.global_offset;
  }
  if (t.block_bytes != 0) {
    j["block_bytes"] = t.block_bytes;
    nlohmann::ordered_json blocks = nlohmann::ordered_json::array();
    for (uint64_t h : t.block_xxh3) blocks.push_back(HashToHex(h));
    j["block_xxh3"] = std::move(blocks);
  }
  if (!t.chunks.empty()) {
    nlohmann::ordered_json chunks = nlohmann::ordered_json::array();
    for (const TensorInfo::Chunk& c : t.chunks) {
      chunks.push_back({{"rank", c.rank},
                        {"offset", c.offset},
                        {"shape", c.shape},
                        {"stored_bytes", c.stored_bytes},
                        {"encoding", std::string(RecordEncodingName(c.encoding))},
                        {"shard", c.shard}});
    }
    j["chunks"] = std::move(chunks);
  }
  return j;
}

absl::StatusOr<nlohmann::ordered_json> ExtrasObject(const std::string& extras_json) {
  nlohmann::ordered_json extras =
      nlohmann::ordered_json::parse(extras_json, nullptr, /*allow_exceptions=*/false);
  if (extras.is_discarded() || !extras.is_object()) {
    return absl::InvalidArgumentError("extras are not a JSON object");
  }
  return extras;
}

std::string DumpJson(const nlohmann::ordered_json& object) {
  return object.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace internal

std::string SaveStatsJson(const SaveStats& stats) {
  return internal::DumpJson(internal::SaveStatsObject(stats));
}

std::string EngineStatsJson(const EngineStats& stats) {
  return internal::DumpJson(internal::EngineStatsObject(stats));
}

std::string TensorInfoJson(const TensorInfo& tensor) {
  return internal::DumpJson(internal::TensorInfoObject(tensor));
}

}  // namespace ckpt
