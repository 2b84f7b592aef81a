#include "ckpt/kinds.h"

#include "ckpt/distributed.h"

#include "ckpt/options.h"

namespace ckpt {

absl::string_view CheckpointKindName(CheckpointKind kind) {
  switch (kind) {
    case CheckpointKind::kFull: return "full";
    case CheckpointKind::kDelta: return "delta";
  }
  return "unknown";
}

std::optional<CheckpointKind> ParseCheckpointKind(absl::string_view name) {
  for (CheckpointKind k : {CheckpointKind::kFull, CheckpointKind::kDelta}) {
    if (CheckpointKindName(k) == name) return k;
  }
  return std::nullopt;
}

absl::string_view RecordEncodingName(RecordEncoding encoding) {
  switch (encoding) {
    case RecordEncoding::kRaw: return "raw";
    case RecordEncoding::kZstd: return "zstd";
    case RecordEncoding::kSparse: return "sparse";
    case RecordEncoding::kXor: return "xor";
    case RecordEncoding::kTopK: return "topk";
    case RecordEncoding::kPlanes: return "planes";
    case RecordEncoding::kXorPlanes: return "xor_planes";
  }
  return "unknown";
}

std::optional<RecordEncoding> ParseRecordEncoding(absl::string_view name) {
  for (RecordEncoding e : {RecordEncoding::kRaw, RecordEncoding::kZstd, RecordEncoding::kSparse,
                           RecordEncoding::kXor, RecordEncoding::kTopK, RecordEncoding::kPlanes,
                           RecordEncoding::kXorPlanes}) {
    if (RecordEncodingName(e) == name) return e;
  }
  return std::nullopt;
}

absl::string_view DeltaModeName(DeltaOptions::Mode mode) {
  switch (mode) {
    case DeltaOptions::Mode::kNone: return "none";
    case DeltaOptions::Mode::kExact: return "exact";
    case DeltaOptions::Mode::kTopK: return "topk";
  }
  return "unknown";
}

std::optional<DeltaOptions::Mode> ParseDeltaMode(absl::string_view name) {
  for (DeltaOptions::Mode m :
       {DeltaOptions::Mode::kNone, DeltaOptions::Mode::kExact, DeltaOptions::Mode::kTopK}) {
    if (DeltaModeName(m) == name) return m;
  }
  return std::nullopt;
}

absl::string_view TensorPlacementName(TensorPlacement placement) {
  switch (placement) {
    case TensorPlacement::kDefault: return "default";
    case TensorPlacement::kReplicated: return "replicated";
    case TensorPlacement::kRankLocal: return "rank_local";
    case TensorPlacement::kSharded: return "sharded";
  }
  return "unknown";
}

std::optional<TensorPlacement> ParseTensorPlacement(absl::string_view name) {
  for (TensorPlacement p :
       {TensorPlacement::kDefault, TensorPlacement::kReplicated, TensorPlacement::kRankLocal,
        TensorPlacement::kSharded}) {
    if (TensorPlacementName(p) == name) return p;
  }
  return std::nullopt;
}

}  // namespace ckpt
