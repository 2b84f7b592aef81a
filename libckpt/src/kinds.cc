#include "ckpt/kinds.h"

#include "ckpt/distributed.h"
#include "ckpt/options.h"
#include "codec/record_codecs.h"

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
  return internal::CodecOf(encoding).name;
}

std::optional<RecordEncoding> ParseRecordEncoding(absl::string_view name) {
  for (const internal::RecordCodec& codec : internal::AllRecordCodecs()) {
    if (codec.name == name) return codec.encoding;
  }
  return std::nullopt;
}

bool IsDeltaEncoding(RecordEncoding encoding) { return internal::CodecOf(encoding).is_delta; }

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

namespace {

// The value of `values` whose `name_of` is `name`.
template <typename E, typename NameFn>
std::optional<E> ParseByName(absl::string_view name, std::initializer_list<E> values, NameFn name_of) {
  for (E value : values) {
    if (name_of(value) == name) return value;
  }
  return std::nullopt;
}

}  // namespace

absl::string_view DeltaBaseName(DeltaOptions::Base base) {
  switch (base) {
    case DeltaOptions::Base::kDifferential: return "differential";
    case DeltaOptions::Base::kChained: return "chained";
  }
  return "unknown";
}

std::optional<DeltaOptions::Base> ParseDeltaBase(absl::string_view name) {
  return ParseByName(name, {DeltaOptions::Base::kDifferential, DeltaOptions::Base::kChained},
                     DeltaBaseName);
}

// A codec is named as the record encoding it writes (the codec table's
// `selected_by`), so that a new codec is named in one place.
absl::string_view CompressionCodecName(CompressionCodec codec) {
  if (codec == CompressionCodec::kNone) return "none";
  for (const internal::RecordCodec& c : internal::AllRecordCodecs()) {
    if (c.selected_by == codec) return c.name;
  }
  return "unknown";
}

std::optional<CompressionCodec> ParseCompressionCodec(absl::string_view name) {
  if (name == "none") return CompressionCodec::kNone;
  for (const internal::RecordCodec& c : internal::AllRecordCodecs()) {
    if (c.name == name && c.selected_by.has_value()) return c.selected_by;
  }
  return std::nullopt;
}

absl::string_view IoBackendName(IoBackend backend) {
  switch (backend) {
    case IoBackend::kAuto: return "auto";
    case IoBackend::kUring: return "uring";
    case IoBackend::kThreads: return "threads";
  }
  return "unknown";
}

std::optional<IoBackend> ParseIoBackend(absl::string_view name) {
  return ParseByName(name, {IoBackend::kAuto, IoBackend::kUring, IoBackend::kThreads}, IoBackendName);
}

absl::string_view DirectIoModeName(DirectIoMode mode) {
  switch (mode) {
    case DirectIoMode::kAuto: return "auto";
    case DirectIoMode::kOn: return "on";
    case DirectIoMode::kOff: return "off";
  }
  return "unknown";
}

std::optional<DirectIoMode> ParseDirectIoMode(absl::string_view name) {
  return ParseByName(name, {DirectIoMode::kAuto, DirectIoMode::kOn, DirectIoMode::kOff},
                     DirectIoModeName);
}

absl::string_view BusyPolicyName(EngineOptions::BusyPolicy policy) {
  switch (policy) {
    case EngineOptions::BusyPolicy::kWait: return "wait";
    case EngineOptions::BusyPolicy::kSkip: return "skip";
  }
  return "unknown";
}

std::optional<EngineOptions::BusyPolicy> ParseBusyPolicy(absl::string_view name) {
  return ParseByName(name, {EngineOptions::BusyPolicy::kWait, EngineOptions::BusyPolicy::kSkip},
                     BusyPolicyName);
}

}  // namespace ckpt
