#include "format/global_tensors.h"

#include <algorithm>
#include <map>
#include <numeric>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ckpt::internal {
namespace {

std::string Box(const TensorInfo& chunk) {
  std::vector<std::string> dims;
  for (size_t d = 0; d < chunk.shape.size(); ++d) {
    dims.push_back(absl::StrCat(chunk.global_offset[d], ":", chunk.global_offset[d] + chunk.shape[d]));
  }
  return absl::StrCat("[", absl::StrJoin(dims, ", "), "]");
}

bool Overlap(const TensorInfo& a, const TensorInfo& b) {
  for (size_t d = 0; d < a.shape.size(); ++d) {
    const int64_t a0 = a.global_offset[d], a1 = a0 + a.shape[d];
    const int64_t b0 = b.global_offset[d], b1 = b0 + b.shape[d];
    if (a1 <= b0 || b1 <= a0) return false;
  }
  return true;
}

// kInvalidArgument naming the first two chunks of `global` that overlap.
// Chunks are swept along the dimension where their offsets differ most, so
// chunks split along one dimension (the usual case) are compared only with
// their neighbours.
absl::Status CheckDisjoint(const GlobalTensor& global, std::span<const RankRecords> parts) {
  std::vector<const GlobalTensor::Piece*> pieces;
  for (const GlobalTensor::Piece& p : global.pieces) {
    if (p.record->raw_bytes > 0 || global.shape.empty()) pieces.push_back(&p);
  }
  if (pieces.size() < 2 || global.shape.empty()) {
    if (pieces.size() >= 2) {  // two chunks of a scalar
      return absl::InvalidArgumentError(absl::StrCat("sharded tensor \"", global.name,
                                                     "\" is a scalar saved by more than one rank"));
    }
    return absl::OkStatus();
  }
  size_t sweep = 0, most = 0;
  for (size_t d = 0; d < global.shape.size(); ++d) {
    std::vector<int64_t> starts;
    for (const GlobalTensor::Piece* p : pieces) starts.push_back(p->record->global_offset[d]);
    std::sort(starts.begin(), starts.end());
    const size_t distinct = std::unique(starts.begin(), starts.end()) - starts.begin();
    if (distinct > most) most = distinct, sweep = d;
  }
  std::sort(pieces.begin(), pieces.end(), [sweep](const GlobalTensor::Piece* a, const GlobalTensor::Piece* b) {
    return a->record->global_offset[sweep] < b->record->global_offset[sweep];
  });
  for (size_t i = 0; i < pieces.size(); ++i) {
    const TensorInfo& a = *pieces[i]->record;
    const int64_t end = a.global_offset[sweep] + a.shape[sweep];
    for (size_t j = i + 1; j < pieces.size() && pieces[j]->record->global_offset[sweep] < end; ++j) {
      const TensorInfo& b = *pieces[j]->record;
      if (Overlap(a, b)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "sharded tensor \"", global.name, "\": the chunk ", Box(a), " of rank ",
            parts[pieces[i]->part].rank, " overlaps the chunk ", Box(b), " of rank ",
            parts[pieces[j]->part].rank));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<GlobalTensor>> GatherGlobalTensors(std::span<const RankRecords> parts) {
  std::vector<GlobalTensor> globals;
  absl::flat_hash_map<std::string, size_t> index;
  absl::flat_hash_map<std::string, int> unsharded;  // name -> a rank holding it unsharded
  for (size_t p = 0; p < parts.size(); ++p) {
    for (const TensorInfo& t : *parts[p].tensors) {
      if (t.placement != TensorPlacement::kSharded) {
        unsharded.emplace(t.name, parts[p].rank);
        continue;
      }
      auto [it, inserted] = index.emplace(t.name, globals.size());
      if (inserted) globals.push_back(GlobalTensor{t.name, t.dtype, t.global_shape, {}});
      GlobalTensor& g = globals[it->second];
      if (t.dtype != g.dtype || t.global_shape != g.shape) {
        const TensorInfo& first = *g.pieces.front().record;
        return absl::InvalidArgumentError(absl::StrCat(
            "sharded tensor \"", t.name, "\" is a chunk of a ", DTypeName(first.dtype), " [",
            absl::StrJoin(first.global_shape, ", "), "] tensor on rank ", parts[g.pieces.front().part].rank,
            " but of a ", DTypeName(t.dtype), " [", absl::StrJoin(t.global_shape, ", "), "] one on rank ",
            parts[p].rank));
      }
      g.pieces.push_back(GlobalTensor::Piece{p, &t});
    }
  }
  for (const GlobalTensor& g : globals) {
    if (auto it = unsharded.find(g.name); it != unsharded.end()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", g.name, "\" is sharded on rank ",
                                                     parts[g.pieces.front().part].rank,
                                                     " but saved whole on rank ", it->second));
    }
    // Disjoint chunks inside the tensor cover it exactly when their
    // elements add up to its own.
    uint64_t elements = 0, global_elements = 1;
    for (int64_t d : g.shape) global_elements *= static_cast<uint64_t>(d);
    for (const GlobalTensor::Piece& p : g.pieces) elements += p.record->raw_bytes / DTypeSize(g.dtype);
    absl::Status disjoint = CheckDisjoint(g, parts);
    if (!disjoint.ok()) return disjoint;
    if (elements != global_elements) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sharded tensor \"", g.name, "\" [", absl::StrJoin(g.shape, ", "), "]: its chunks on ranks ",
          absl::StrJoin(g.pieces, ", ", [&](std::string* out, const GlobalTensor::Piece& p) {
            absl::StrAppend(out, parts[p.part].rank);
          }),
          " hold ", elements, " of its ", global_elements, " elements (a rank's chunk is missing)"));
    }
  }
  return globals;
}

TensorInfo GlobalTensorInfo(const GlobalTensor& global, std::span<const RankRecords> parts) {
  TensorInfo info;
  info.name = global.name;
  info.dtype = global.dtype;
  info.shape = global.shape;
  info.global_shape = global.shape;
  info.global_offset.assign(global.shape.size(), 0);
  info.placement = TensorPlacement::kSharded;
  info.rank = -1;
  info.xxh3 = 0;
  for (const GlobalTensor::Piece& p : global.pieces) {
    const TensorInfo& r = *p.record;
    info.raw_bytes += r.raw_bytes;
    info.stored_bytes += r.stored_bytes;
    info.error_bound = std::max(info.error_bound, r.error_bound);
    info.chunks.push_back(TensorInfo::Chunk{parts[p.part].rank, r.global_offset, r.shape, r.stored_bytes,
                                            r.encoding});
  }
  return info;
}

}  // namespace ckpt::internal
