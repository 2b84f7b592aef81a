#include "format/global_manifest.h"

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "format/json_forms.h"
#include "format/manifest.h"
#include "format/names.h"
#include "util/hash.h"

namespace ckpt::internal {
namespace {

using Json = nlohmann::ordered_json;

// The integer member `key` of `j` (kDataLoss naming it if missing or not an
// integer in [lo, hi]).
absl::StatusOr<int64_t> IntField(const Json& j, const char* key, int64_t lo, int64_t hi,
                                 absl::string_view path) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer()) {
    return CorruptManifest(path, absl::StrCat("field \"", key, "\" is missing or not an integer"));
  }
  const int64_t v = it->get<int64_t>();
  if (v < lo || v > hi) return CorruptManifest(path, absl::StrCat("field \"", key, "\" is out of range: ", v));
  return v;
}

absl::StatusOr<std::string> StringField(const Json& j, const char* key, absl::string_view path) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) {
    return CorruptManifest(path, absl::StrCat("field \"", key, "\" is missing or not a string"));
  }
  return it->get<std::string>();
}

}  // namespace

namespace {

// Stops at the top-level "format_version" member's value.
class FormatVersionFinder final : public nlohmann::json_sax<Json> {
 public:
  std::optional<int64_t> version;

  bool key(string_t& name) override {
    at_version_ = depth_ == 1 && name == "format_version";
    return true;
  }
  bool number_integer(number_integer_t v) override { return Integer(v); }
  bool number_unsigned(number_unsigned_t v) override {
    return v <= static_cast<number_unsigned_t>(INT64_MAX) ? Integer(static_cast<int64_t>(v)) : Other();
  }
  bool null() override { return Other(); }
  bool boolean(bool) override { return Other(); }
  bool number_float(number_float_t, const string_t&) override { return Other(); }
  bool string(string_t&) override { return Other(); }
  bool binary(binary_t&) override { return Other(); }
  bool start_object(std::size_t) override {
    if (!Other()) return false;
    ++depth_;
    return true;
  }
  bool end_object() override { return --depth_ > 0; }
  bool start_array(std::size_t) override {
    if (!Other() || depth_ == 0) return false;  // (a top-level array is no manifest)
    ++depth_;
    return true;
  }
  bool end_array() override {
    --depth_;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return false;
  }

 private:
  bool Integer(int64_t v) {
    if (!at_version_) return true;
    version = v;
    return false;  // found: stop
  }
  // A value that is not the version: stop if it was the version's place.
  bool Other() {
    const bool was_version = at_version_;
    at_version_ = false;
    return !was_version;
  }

  int depth_ = 0;
  bool at_version_ = false;
};

}  // namespace

std::optional<int64_t> ManifestFormatVersion(absl::string_view contents) {
  FormatVersionFinder finder;
  (void)Json::sax_parse(contents.begin(), contents.end(), &finder);
  return finder.version;
}

bool IsGlobalManifest(absl::string_view contents) {
  return ManifestFormatVersion(contents) == kMultiRankFormatVersion;
}

absl::StatusOr<std::string> SerializeGlobalManifest(GlobalManifest* manifest) {
  const GlobalManifest& m = *manifest;
  Json j;
  j["format_version"] = m.format_version;
  j["step"] = m.step;
  j["kind"] = std::string(CheckpointKindName(m.kind));
  if (m.kind == CheckpointKind::kDelta) {
    j["base"] = {{"step", m.base_step}};
    j["delta_mode"] = std::string(DeltaModeName(m.delta_mode));
  }
  j["world_size"] = m.world_size;
  j["created_unix_ns"] = m.created_unix_ns;
  j["writer"] = m.writer;
  absl::StatusOr<Json> extras = ExtrasObject(m.extras_json);
  if (!extras.ok()) return extras.status();
  j["extras"] = std::move(*extras);
  Json ranks = Json::array();
  for (const RankPart& r : m.ranks) {
    Json part = {{"rank", r.rank},
                 {"manifest", r.manifest},
                 {"manifest_xxh3", HashToHex(r.manifest_xxh3)},
                 {"kind", std::string(CheckpointKindName(r.kind))}};
    if (r.kind == CheckpointKind::kDelta) part["base_step"] = r.base_step;
    part["tensor_bytes"] = r.tensor_bytes;
    part["file_bytes"] = r.file_bytes;
    part["tensor_count"] = r.tensor_count;
    part["shard_count"] = r.shard_count;
    ranks.push_back(std::move(part));
  }
  j["ranks"] = std::move(ranks);
  return SealManifest(j, &manifest->manifest_xxh3);
}

absl::StatusOr<GlobalManifest> ParseGlobalManifest(absl::string_view contents,
                                                   absl::string_view path) {
  auto checksum = CheckManifestChecksum(contents, path);
  if (!checksum.ok()) return checksum.status();
  Json j = Json::parse(contents, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return CorruptManifest(path, "not a JSON object");
  GlobalManifest m;
  m.manifest_xxh3 = *checksum;
  auto version = IntField(j, "format_version", 0, INT32_MAX, path);
  if (!version.ok()) return version.status();
  if (*version > kMultiRankFormatVersion) {
    return absl::UnimplementedError(absl::StrCat("manifest ", path, ": format version ", *version,
                                                 " is not supported (this ckpt reads up to ",
                                                 kMultiRankFormatVersion, ")"));
  }
  if (*version != kMultiRankFormatVersion) {
    return CorruptManifest(path, absl::StrCat("format version ", *version, " is not a multi-rank manifest"));
  }
  m.format_version = static_cast<int>(*version);
  auto step = IntField(j, "step", 0, INT64_MAX, path);
  if (!step.ok()) return step.status();
  m.step = *step;
  auto world = IntField(j, "world_size", 1, kMaxWorldSize, path);
  if (!world.ok()) return world.status();
  m.world_size = static_cast<int>(*world);
  auto kind_name = StringField(j, "kind", path);
  if (!kind_name.ok()) return kind_name.status();
  std::optional<CheckpointKind> kind = ParseCheckpointKind(*kind_name);
  if (!kind.has_value()) return CorruptManifest(path, absl::StrCat("unknown kind \"", *kind_name, "\""));
  m.kind = *kind;
  if (m.kind == CheckpointKind::kDelta) {
    auto base = j.find("base");
    if (base == j.end() || !base->is_object()) return CorruptManifest(path, "delta without a base");
    auto base_step = IntField(*base, "step", 0, m.step - 1, path);
    if (!base_step.ok()) return base_step.status();
    m.base_step = *base_step;
    auto mode_name = StringField(j, "delta_mode", path);
    if (!mode_name.ok()) return mode_name.status();
    std::optional<DeltaOptions::Mode> mode = ParseDeltaMode(*mode_name);
    if (!mode.has_value() || *mode == DeltaOptions::Mode::kNone) {
      return CorruptManifest(path, absl::StrCat("unknown delta_mode \"", *mode_name, "\""));
    }
    m.delta_mode = *mode;
  }
  auto created = IntField(j, "created_unix_ns", INT64_MIN, INT64_MAX, path);
  if (!created.ok()) return created.status();
  m.created_unix_ns = *created;
  auto writer = StringField(j, "writer", path);
  if (!writer.ok()) return writer.status();
  m.writer = *writer;
  auto extras = j.find("extras");
  if (extras == j.end() || !extras->is_object()) return CorruptManifest(path, "extras is not an object");
  m.extras_json = extras->dump();
  auto ranks = j.find("ranks");
  if (ranks == j.end() || !ranks->is_array() || ranks->size() != static_cast<size_t>(m.world_size)) {
    return CorruptManifest(path, absl::StrCat("ranks is not an array of world_size (", m.world_size,
                                      ") parts"));
  }
  bool any_delta = false;
  for (size_t i = 0; i < ranks->size(); ++i) {
    const Json& r = (*ranks)[i];
    if (!r.is_object()) return CorruptManifest(path, absl::StrCat("part #", i, " is not an object"));
    RankPart part;
    auto rank = IntField(r, "rank", i, i, path);
    if (!rank.ok()) return CorruptManifest(path, absl::StrCat("part #", i, " is not rank ", i));
    part.rank = static_cast<int>(*rank);
    auto name = StringField(r, "manifest", path);
    if (!name.ok()) return name.status();
    if (*name != RankManifestName(part.rank)) {
      return CorruptManifest(path, absl::StrCat("part #", i, " names manifest \"", *name, "\", not \"",
                                        RankManifestName(part.rank), "\""));
    }
    part.manifest = *name;
    auto hash_hex = StringField(r, "manifest_xxh3", path);
    if (!hash_hex.ok()) return hash_hex.status();
    auto hash = HashFromHex(*hash_hex);
    if (!hash.ok()) return CorruptManifest(path, hash.status().message());
    part.manifest_xxh3 = *hash;
    auto part_kind_name = StringField(r, "kind", path);
    if (!part_kind_name.ok()) return part_kind_name.status();
    std::optional<CheckpointKind> part_kind = ParseCheckpointKind(*part_kind_name);
    if (!part_kind.has_value()) {
      return CorruptManifest(path, absl::StrCat("part #", i, ": unknown kind \"", *part_kind_name, "\""));
    }
    part.kind = *part_kind;
    if (part.kind == CheckpointKind::kDelta) {
      any_delta = true;
      auto base_step = IntField(r, "base_step", 0, m.step - 1, path);
      if (!base_step.ok()) return base_step.status();
      part.base_step = *base_step;
      if (m.kind != CheckpointKind::kDelta || part.base_step != m.base_step) {
        return CorruptManifest(path, absl::StrCat("part #", i, " is a delta of step ", part.base_step,
                                          " but the checkpoint's base is ", m.base_step));
      }
    }
    for (auto [key, out] : {std::pair{"tensor_bytes", &part.tensor_bytes},
                            std::pair{"file_bytes", &part.file_bytes}}) {
      auto v = IntField(r, key, 0, INT64_MAX, path);
      if (!v.ok()) return v.status();
      *out = static_cast<uint64_t>(*v);
    }
    for (auto [key, out] : {std::pair{"tensor_count", &part.tensor_count},
                            std::pair{"shard_count", &part.shard_count}}) {
      auto v = IntField(r, key, 0, INT64_MAX, path);
      if (!v.ok()) return v.status();
      *out = static_cast<size_t>(*v);
    }
    m.ranks.push_back(std::move(part));
  }
  if (m.kind == CheckpointKind::kDelta && !any_delta) {
    return CorruptManifest(path, "a delta checkpoint none of whose parts is a delta");
  }
  return m;
}

}  // namespace ckpt::internal
