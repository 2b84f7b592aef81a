// The manifest (format 1) written and parsed. Over 400 lines because the
// parser's field-by-field bounds checks belong together with the writer they
// mirror: a field added to one is visibly missing from the other.
#include "format/manifest.h"

#include <algorithm>
#include <limits>
#include <tuple>

#include <nlohmann/json.hpp>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "codec/record_codecs.h"
#include "format/json_forms.h"
#include "format/names.h"
#include "util/hash.h"

namespace ckpt::internal {
namespace {

using Json = nlohmann::ordered_json;

// (The parser's short name for CorruptManifest.)
constexpr auto& Corrupt = CorruptManifest;

constexpr absl::string_view kChecksumHead = ",\n \"manifest_xxh3\": \"";
constexpr absl::string_view kChecksumTail = "\"\n}\n";
constexpr size_t kChecksumTrailerBytes = kChecksumHead.size() + 16 + kChecksumTail.size();

// Typed field access that reports, rather than throws, a missing or mistyped
// member.
template <typename T>
absl::Status Get(const Json& object, const char* key, absl::string_view path, T* out) {
  auto it = object.find(key);
  if (it == object.end()) return Corrupt(path, absl::StrCat("missing field \"", key, "\""));
  if constexpr (std::is_same_v<T, std::string>) {
    if (!it->is_string()) return Corrupt(path, absl::StrCat("field \"", key, "\" is not a string"));
  } else if constexpr (std::is_same_v<T, uint64_t>) {
    if (!it->is_number_unsigned()) {
      return Corrupt(path, absl::StrCat("field \"", key, "\" is not a non-negative integer"));
    }
  } else if constexpr (std::is_integral_v<T>) {
    if (!it->is_number_integer()) {
      return Corrupt(path, absl::StrCat("field \"", key, "\" is not an integer"));
    }
  }
  *out = it->get<T>();
  return absl::OkStatus();
}

#define CKPT_GET(object, key, out) \
  do { absl::Status s_ = Get(object, key, path, out); if (!s_.ok()) return s_; } while (false)

// A dimension list: at most kMaxRank non-negative integers.
absl::Status ParseDims(const Json& j, absl::string_view path, absl::string_view what,
                       std::vector<int64_t>* out) {
  if (!j.is_array() || j.size() > kMaxRank) {
    return Corrupt(path, absl::StrCat(what, " is not an array of rank <= ", kMaxRank));
  }
  for (const Json& dim : j) {
    if (!dim.is_number_integer() || dim.get<int64_t>() < 0) {
      return Corrupt(path, absl::StrCat(what, " has a negative or non-integer entry"));
    }
    out->push_back(dim.get<int64_t>());
  }
  return absl::OkStatus();
}

// "global_shape" and "global_offset" of a chunk record: the record's box
// lies inside the global tensor.
absl::Status ParseChunkPlace(const Json& j, const Json& global, absl::string_view path,
                             const std::string& where, TensorInfo* t) {
  if (t->placement != TensorPlacement::kSharded) {
    return Corrupt(path, absl::StrCat(where, ": global_shape on a record that is not sharded"));
  }
  auto offset = j.find("global_offset");
  if (offset == j.end()) return Corrupt(path, absl::StrCat(where, ": global_shape without global_offset"));
  absl::Status s = ParseDims(global, path, absl::StrCat(where, ": global_shape"), &t->global_shape);
  if (s.ok()) s = ParseDims(*offset, path, absl::StrCat(where, ": global_offset"), &t->global_offset);
  if (!s.ok()) return s;
  if (!TensorBytes(t->dtype, t->global_shape).ok()) {
    return Corrupt(path, absl::StrCat(where, ": global_shape is too large"));
  }
  if (t->global_shape.size() != t->shape.size() || t->global_offset.size() != t->shape.size()) {
    return Corrupt(path, absl::StrCat(where, ": global_shape and global_offset must have rank ",
                                      t->shape.size(), " as the shape does"));
  }
  for (size_t d = 0; d < t->shape.size(); ++d) {
    if (t->global_offset[d] > t->global_shape[d] ||
        t->shape[d] > t->global_shape[d] - t->global_offset[d]) {
      return Corrupt(path, absl::StrCat(where, ": the chunk reaches past the global tensor in dimension ", d));
    }
  }
  return absl::OkStatus();
}

// "block_bytes" and "block_xxh3" of a record stored whole: one hash per
// block of its raw bytes.
absl::Status ParseBlockHashes(const Json& j, const Json& block_bytes, absl::string_view path,
                              const std::string& where, TensorInfo* t) {
  if (!block_bytes.is_number_unsigned() || block_bytes.get<uint64_t>() == 0 ||
      block_bytes.get<uint64_t>() % kRecordAlignment != 0) {
    return Corrupt(path, absl::StrCat(where, ": block_bytes is not a positive multiple of ", kRecordAlignment));
  }
  t->block_bytes = block_bytes.get<uint64_t>();
  if (t->encoding != RecordEncoding::kRaw) {
    return Corrupt(path, absl::StrCat(where, ": block hashes on a record not stored whole"));
  }
  auto hashes = j.find("block_xxh3");
  const uint64_t blocks = (t->raw_bytes + t->block_bytes - 1) / t->block_bytes;
  if (hashes == j.end() || !hashes->is_array() || hashes->size() != blocks) {
    return Corrupt(path, absl::StrCat(where, ": block_xxh3 is not an array of ", blocks, " hashes"));
  }
  t->block_xxh3.reserve(blocks);
  for (const Json& h : *hashes) {
    auto hash = h.is_string() ? HashFromHex(h.get<std::string>())
                              : absl::StatusOr<uint64_t>(absl::InvalidArgumentError("not a string"));
    if (!hash.ok()) return Corrupt(path, absl::StrCat(where, ": block_xxh3: ", hash.status().message()));
    t->block_xxh3.push_back(*hash);
  }
  return absl::OkStatus();
}

absl::StatusOr<TensorInfo> ParseTensor(const Json& j, absl::string_view path, size_t index,
                                       const std::unordered_map<std::string, uint64_t>& shards,
                                       uint64_t alignment) {
  if (!j.is_object()) return Corrupt(path, absl::StrCat("tensor #", index, " is not an object"));
  TensorInfo t;
  std::string dtype, xxh3;
  CKPT_GET(j, "name", &t.name);
  absl::Status name_ok = ValidateTensorName(t.name);
  if (!name_ok.ok()) return Corrupt(path, absl::StrCat("tensor #", index, ": ", name_ok.message()));
  const std::string where = absl::StrCat("tensor \"", t.name, "\"");
  CKPT_GET(j, "dtype", &dtype);
  auto parsed = DTypeFromName(dtype);
  if (!parsed.ok()) return Corrupt(path, absl::StrCat(where, ": ", parsed.status().message()));
  t.dtype = *parsed;
  auto shape = j.find("shape");
  if (shape == j.end() || !shape->is_array() || shape->size() > kMaxRank) {
    return Corrupt(path, absl::StrCat(where, ": shape is missing, not an array or of rank > ", kMaxRank));
  }
  for (const Json& dim : *shape) {
    if (!dim.is_number_integer() || dim.get<int64_t>() < 0) {
      return Corrupt(path, absl::StrCat(where, ": shape has a negative or non-integer dimension"));
    }
    t.shape.push_back(dim.get<int64_t>());
  }
  CKPT_GET(j, "raw_bytes", &t.raw_bytes);
  CKPT_GET(j, "stored_bytes", &t.stored_bytes);
  std::string encoding;
  CKPT_GET(j, "encoding", &encoding);
  CKPT_GET(j, "shard", &t.shard);
  CKPT_GET(j, "offset", &t.offset);
  CKPT_GET(j, "xxh3", &xxh3);
  auto hash = HashFromHex(xxh3);
  if (!hash.ok()) return Corrupt(path, absl::StrCat(where, ": ", hash.status().message()));
  t.xxh3 = *hash;
  if (auto stored = j.find("stored_xxh3"); stored != j.end()) {
    auto stored_hash = stored->is_string() ? HashFromHex(stored->get<std::string>())
                                           : absl::StatusOr<uint64_t>(absl::InvalidArgumentError("not a string"));
    if (!stored_hash.ok()) {
      return Corrupt(path, absl::StrCat(where, ": stored_xxh3: ", stored_hash.status().message()));
    }
    t.stored_xxh3 = *stored_hash;
  }

  auto bytes = TensorBytes(t.dtype, t.shape);
  if (!bytes.ok() || *bytes != t.raw_bytes) {
    return Corrupt(path, absl::StrCat(where, ": shape and dtype do not match raw_bytes ", t.raw_bytes));
  }
  std::optional<RecordEncoding> parsed_encoding = ParseRecordEncoding(encoding);
  if (!parsed_encoding.has_value()) {
    return Corrupt(path, absl::StrCat(where, ": unknown encoding \"", encoding, "\""));
  }
  t.encoding = *parsed_encoding;
  const RecordCodec& codec = CodecOf(t.encoding);
  if (t.encoding == RecordEncoding::kRaw && t.stored_bytes != t.raw_bytes) {
    return Corrupt(path, absl::StrCat(where, ": raw record stores ", t.stored_bytes,
                                      " bytes, not raw_bytes ", t.raw_bytes));
  }
  if (t.stored_bytes < codec.min_stored_bytes(t.raw_bytes)) {
    return Corrupt(path, absl::StrCat(where, ": a ", codec.name, " record of ", t.stored_bytes,
                                      " bytes cannot hold raw_bytes ", t.raw_bytes));
  }
  if (auto placement = j.find("placement"); placement != j.end()) {
    std::optional<TensorPlacement> parsed_placement =
        placement->is_string() ? ParseTensorPlacement(placement->get<std::string>()) : std::nullopt;
    if (!parsed_placement.has_value()) {
      return Corrupt(path, absl::StrCat(where, ": unknown placement ", placement->dump()));
    }
    t.placement = *parsed_placement;
  }
  if (auto global = j.find("global_shape"); global != j.end()) {
    absl::Status placed = ParseChunkPlace(j, *global, path, where, &t);
    if (!placed.ok()) return placed;
  } else if (t.placement == TensorPlacement::kSharded) {
    return Corrupt(path, absl::StrCat(where, ": a sharded record without global_shape"));
  }
  if (auto block_bytes = j.find("block_bytes"); block_bytes != j.end()) {
    absl::Status blocks = ParseBlockHashes(j, *block_bytes, path, where, &t);
    if (!blocks.ok()) return blocks;
  }
  auto bound = j.find("error_bound");
  if (bound != j.end()) {
    if (!bound->is_number() || !(bound->get<double>() >= 0)) {
      return Corrupt(path, absl::StrCat(where, ": error_bound is not a non-negative number"));
    }
    t.error_bound = bound->get<double>();
  }
  auto shard = shards.find(t.shard);
  if (shard == shards.end()) {
    return Corrupt(path, absl::StrCat(where, ": shard \"", t.shard, "\" is not listed"));
  }
  if (t.offset % alignment != 0 || t.offset > shard->second ||
      t.stored_bytes > shard->second - t.offset) {
    return Corrupt(path, absl::StrCat(where, ": record [", t.offset, ", +", t.stored_bytes,
                                      ") lies outside shard \"", t.shard, "\" of ",
                                      shard->second, " bytes or is misaligned"));
  }
  return t;
}

}  // namespace

uint64_t Manifest::tensor_bytes() const {
  uint64_t sum = 0;
  for (const auto& t : tensors) sum += t.raw_bytes;
  return sum;
}

uint64_t Manifest::shard_bytes() const {
  uint64_t sum = 0;
  for (const auto& s : shards) sum += s.bytes;
  return sum;
}

void PlaceRawRecords(const PlannedShard& shard, uint64_t file_bytes, Manifest* manifest) {
  manifest->shards.push_back(ShardInfo{shard.file, file_bytes});
  for (const PlannedRecord& r : shard.records) {
    TensorInfo& t = manifest->tensors[r.tensor];
    t.shard = shard.file;
    t.offset = r.offset;
    t.stored_bytes = t.raw_bytes;
    t.encoding = RecordEncoding::kRaw;
    t.stored_xxh3.reset();  // (a compacted delta's tensors keep no stale one)
  }
}

absl::StatusOr<std::string> SerializeManifest(Manifest* manifest) {
  const Manifest& m = *manifest;
  Json j;
  j["format_version"] = m.format_version;
  j["step"] = m.step;
  j["kind"] = std::string(CheckpointKindName(m.kind));
  if (m.kind == CheckpointKind::kDelta) {
    j["base"] = {{"step", m.base_step}, {"manifest_xxh3", HashToHex(m.base_manifest_xxh3)}};
    j["delta_mode"] = std::string(DeltaModeName(m.delta_mode));
  }
  if (m.compacted) {
    j["compacted_from"] = {{"manifest_xxh3", HashToHex(m.compacted_from_manifest_xxh3)},
                           {"base_step", m.compacted_from_base_step},
                           {"delta_mode", std::string(DeltaModeName(m.compacted_from_delta_mode))},
                           {"compacted_unix_ns", m.compacted_unix_ns}};
  }
  j["created_unix_ns"] = m.created_unix_ns;
  j["writer"] = m.writer;
  j["alignment"] = m.alignment;
  absl::StatusOr<Json> extras = ExtrasObject(m.extras_json);
  if (!extras.ok()) return extras.status();
  j["extras"] = std::move(*extras);
  Json shards = Json::array();
  for (const ShardInfo& s : m.shards) shards.push_back({{"file", s.file}, {"bytes", s.bytes}});
  j["shards"] = std::move(shards);
  Json tensors = Json::array();
  for (const TensorInfo& t : m.tensors) {
    tensors.push_back(TensorInfoObject(t));
    if (t.error_bound == 0) tensors.back().erase("error_bound");  // only lossy records carry one
    tensors.back().erase("rank");  // a rank's manifest is the rank's own
  }
  j["tensors"] = std::move(tensors);
  return SealManifest(j, &manifest->manifest_xxh3);
}

absl::Status CorruptManifest(absl::string_view path, absl::string_view what) {
  return absl::DataLossError(absl::StrCat("manifest ", path, ": ", what));
}

absl::StatusOr<std::string> SealManifest(const Json& object, uint64_t* hash) {
  std::string text;
  try {
    text = object.dump(1, ' ', /*ensure_ascii=*/false, Json::error_handler_t::strict);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("cannot encode manifest: ", e.what()));
  }
  // `text` ends with "\n}": drop the brace, append the checksum member.
  text.resize(text.size() - 2);
  *hash = Xxh3(text.data(), text.size());
  absl::StrAppend(&text, kChecksumHead, HashToHex(*hash), kChecksumTail);
  return text;
}

absl::StatusOr<uint64_t> CheckManifestChecksum(absl::string_view contents, absl::string_view path) {
  if (contents.size() > kMaxManifestBytes) {
    return Corrupt(path, absl::StrCat(contents.size(), " bytes exceeds the ", kMaxManifestBytes, " limit"));
  }
  if (contents.size() < kChecksumTrailerBytes + 2) return Corrupt(path, "truncated");
  const size_t body = contents.size() - kChecksumTrailerBytes;
  if (contents.substr(body, kChecksumHead.size()) != kChecksumHead ||
      contents.substr(contents.size() - kChecksumTail.size()) != kChecksumTail) {
    return Corrupt(path, "checksum trailer missing (truncated or not a ckpt manifest)");
  }
  auto stored = HashFromHex(contents.substr(body + kChecksumHead.size(), 16));
  if (!stored.ok()) return Corrupt(path, stored.status().message());
  const uint64_t actual = Xxh3(contents.data(), body);
  if (actual != *stored) {
    return Corrupt(path, absl::StrCat("checksum mismatch: stored ", HashToHex(*stored),
                                      ", computed ", HashToHex(actual)));
  }
  return actual;
}

namespace {

// A delta's "base" and "delta_mode". REQUIRES: `m->step` is parsed.
absl::Status ParseDeltaBase(const Json& j, absl::string_view path, Manifest* out) {
  Manifest& m = *out;
  auto base = j.find("base");
  if (base == j.end() || !base->is_object()) return Corrupt(path, "delta without a base");
  std::string base_hash;
  CKPT_GET(*base, "step", &m.base_step);
  CKPT_GET(*base, "manifest_xxh3", &base_hash);
  auto parsed_hash = HashFromHex(base_hash);
  if (!parsed_hash.ok()) return Corrupt(path, parsed_hash.status().message());
  m.base_manifest_xxh3 = *parsed_hash;
  std::string delta_mode;
  CKPT_GET(j, "delta_mode", &delta_mode);
  if (m.base_step < 0 || m.base_step >= m.step) {
    return Corrupt(path, absl::StrCat("delta base step ", m.base_step, " is not before step ", m.step));
  }
  std::optional<DeltaOptions::Mode> mode = ParseDeltaMode(delta_mode);
  if (!mode.has_value() || *mode == DeltaOptions::Mode::kNone) {
    return Corrupt(path, absl::StrCat("unknown delta_mode \"", delta_mode, "\""));
  }
  m.delta_mode = *mode;
  return absl::OkStatus();
}

// A compacted checkpoint's "compacted_from" (`from`). REQUIRES: `m->kind`.
absl::Status ParseCompactedFrom(const Json& from, absl::string_view path, Manifest* out) {
  Manifest& m = *out;
  if (m.kind != CheckpointKind::kFull || !from.is_object()) {
    return Corrupt(path, "compacted_from is not an object of a full checkpoint");
  }
  std::string hash;
  CKPT_GET(from, "manifest_xxh3", &hash);
  auto parsed_hash = HashFromHex(hash);
  if (!parsed_hash.ok()) return Corrupt(path, parsed_hash.status().message());
  m.compacted = true;
  m.compacted_from_manifest_xxh3 = *parsed_hash;
  CKPT_GET(from, "base_step", &m.compacted_from_base_step);
  std::string from_mode;
  CKPT_GET(from, "delta_mode", &from_mode);
  m.compacted_from_delta_mode = ParseDeltaMode(from_mode).value_or(DeltaOptions::Mode::kNone);
  CKPT_GET(from, "compacted_unix_ns", &m.compacted_unix_ns);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Manifest> ParseManifest(absl::string_view contents, absl::string_view path) {
  auto checksum = CheckManifestChecksum(contents, path);
  if (!checksum.ok()) return checksum.status();
  const uint64_t actual = *checksum;
  Json j = Json::parse(contents, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Corrupt(path, "not a JSON object");

  Manifest m;
  CKPT_GET(j, "format_version", &m.format_version);
  if (m.format_version > kFormatVersion || m.format_version < 1) {
    return absl::UnimplementedError(absl::StrCat(
        "manifest ", path, ": format version ", m.format_version,
        " is not supported (this ckpt reads version ", kFormatVersion,
        ", and 2 for the step manifest of a multi-rank checkpoint)"));
  }
  CKPT_GET(j, "step", &m.step);
  std::string kind;
  CKPT_GET(j, "kind", &kind);
  m.manifest_xxh3 = actual;
  std::optional<CheckpointKind> parsed_kind = ParseCheckpointKind(kind);
  if (!parsed_kind.has_value()) return Corrupt(path, absl::StrCat("unknown kind \"", kind, "\""));
  m.kind = *parsed_kind;
  if (m.kind == CheckpointKind::kDelta) {
    absl::Status base = ParseDeltaBase(j, path, &m);
    if (!base.ok()) return base;
  }
  if (auto from = j.find("compacted_from"); from != j.end()) {
    absl::Status compacted = ParseCompactedFrom(*from, path, &m);
    if (!compacted.ok()) return compacted;
  }
  CKPT_GET(j, "created_unix_ns", &m.created_unix_ns);
  CKPT_GET(j, "writer", &m.writer);
  CKPT_GET(j, "alignment", &m.alignment);
  if (m.alignment == 0 || m.alignment % 512 != 0 || m.alignment > (uint64_t{1} << 30)) {
    return Corrupt(path, absl::StrCat("alignment ", m.alignment, " is invalid"));
  }
  auto extras = j.find("extras");
  if (extras == j.end() || !extras->is_object()) return Corrupt(path, "extras is not an object");
  m.extras_json = extras->dump();

  auto shards = j.find("shards");
  if (shards == j.end() || !shards->is_array()) return Corrupt(path, "shards is not an array");
  std::unordered_map<std::string, uint64_t> shard_bytes;
  for (const Json& s : *shards) {
    if (!s.is_object()) return Corrupt(path, "a shard entry is not an object");
    ShardInfo info;
    CKPT_GET(s, "file", &info.file);
    CKPT_GET(s, "bytes", &info.bytes);
    if (!IsSafeFileName(info.file) || info.file == kManifestName ||
        absl::EndsWith(info.file, ".MANIFEST.json")) {
      return Corrupt(path, absl::StrCat("shard file name \"", absl::CHexEscape(info.file),
                                        "\" is not a plain file name in the checkpoint"));
    }
    if (info.bytes > kMaxShardBytes) {
      return Corrupt(path, absl::StrCat("shard \"", info.file, "\" claims ", info.bytes, " bytes"));
    }
    if (!shard_bytes.emplace(info.file, info.bytes).second) {
      return Corrupt(path, absl::StrCat("shard \"", info.file, "\" is listed twice"));
    }
    m.shards.push_back(std::move(info));
  }

  auto tensors = j.find("tensors");
  if (tensors == j.end() || !tensors->is_array()) return Corrupt(path, "tensors is not an array");
  if (tensors->size() > kMaxTensors) return Corrupt(path, "absurd tensor count");
  m.tensors.reserve(tensors->size());
  absl::flat_hash_set<absl::string_view> names;
  for (size_t i = 0; i < tensors->size(); ++i) {
    auto t = ParseTensor((*tensors)[i], path, i, shard_bytes, m.alignment);
    if (!t.ok()) return t.status();
    if (m.kind != CheckpointKind::kDelta && IsDeltaEncoding(t->encoding)) {
      return Corrupt(path, absl::StrCat("tensor \"", t->name, "\" is a delta in a full checkpoint"));
    }
    m.tensors.push_back(std::move(*t));
  }
  for (const TensorInfo& t : m.tensors) {
    if (!names.insert(t.name).second) {
      return Corrupt(path, absl::StrCat("tensor \"", t.name, "\" is listed twice"));
    }
  }
  // No two records share bytes of a shard: a writer never lays them out so,
  // and a reader must not be made to read one record as two tensors.
  std::vector<const TensorInfo*> records;
  records.reserve(m.tensors.size());
  for (const TensorInfo& t : m.tensors) {
    if (t.stored_bytes > 0) records.push_back(&t);
  }
  std::sort(records.begin(), records.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return std::tie(a->shard, a->offset) < std::tie(b->shard, b->offset);
  });
  for (size_t i = 1; i < records.size(); ++i) {
    const TensorInfo& prev = *records[i - 1];
    const TensorInfo& next = *records[i];
    if (prev.shard == next.shard && prev.offset + prev.stored_bytes > next.offset) {
      return Corrupt(path, absl::StrCat("records of tensors \"", prev.name, "\" and \"", next.name,
                                        "\" overlap in shard \"", next.shard, "\""));
    }
  }
  return m;
}

}  // namespace ckpt::internal
