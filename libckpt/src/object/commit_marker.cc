// Commit markers of the object tier (ckpt/object_tier.h): format, keys,
// reading them back.
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "ckpt/object_tier.h"
#include "format/names.h"
#include "util/hash.h"
#include "util/status_macros.h"

namespace ckpt {
namespace {

constexpr size_t kMaxFiles = 1 << 20;
constexpr uint64_t kMaxFileBytes = uint64_t{1} << 50;
constexpr absl::string_view kTrailer = "\nxxh3 ";

}  // namespace

std::string StepPrefix(absl::string_view prefix, int64_t step) {
  return prefix.empty() ? internal::CheckpointDirName(step)
                        : absl::StrCat(prefix, "/", internal::CheckpointDirName(step));
}

std::string MarkerKey(absl::string_view prefix, int64_t step) {
  return StepPrefix(prefix, step) + ".commit";
}

std::string SerializeCommitMarker(const CommitMarker& m) {
  nlohmann::ordered_json j;
  j["format"] = "ckpt-commit-marker-1";
  j["step"] = m.step;
  j["kind"] = m.delta ? "delta" : "full";
  if (m.delta) j["base_step"] = m.base_step;
  j["world_size"] = m.world_size;
  j["manifest_xxh3"] = internal::HashToHex(m.manifest_xxh3);
  if (m.compacted) j["compacted_from_manifest_xxh3"] = internal::HashToHex(m.compacted_from_manifest_xxh3);
  nlohmann::ordered_json files = nlohmann::ordered_json::array();
  for (const CommitMarker::File& f : m.files) {
    files.push_back({{"name", f.name}, {"bytes", f.bytes}, {"xxh3", internal::HashToHex(f.xxh3)}});
  }
  j["files"] = std::move(files);
  j["uploaded_by"] = m.uploaded_by;
  j["uploaded_unix_ns"] = m.uploaded_unix_ns;
  j["verified"] = "readback";
  const std::string body = j.dump(1);
  return absl::StrCat(body, kTrailer, internal::HashToHex(internal::Xxh3(body.data(), body.size())),
                      "\n");
}

absl::StatusOr<CommitMarker> ParseCommitMarker(absl::string_view text, absl::string_view what) {
  auto damaged = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrCat("commit marker ", what, ": ", why));
  };
  const size_t cut = text.rfind(kTrailer);
  if (cut == absl::string_view::npos) return damaged("no checksum line");
  const absl::string_view body = text.substr(0, cut);
  absl::string_view hex = text.substr(cut + kTrailer.size());
  if (absl::EndsWith(hex, "\n")) hex.remove_suffix(1);
  auto sum = internal::HashFromHex(hex);
  if (!sum.ok() || *sum != internal::Xxh3(body.data(), body.size())) {
    return damaged("checksum mismatch");
  }
  nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || j.value("format", "") != "ckpt-commit-marker-1") {
    return damaged("not a ckpt commit marker");
  }
  try {
    CommitMarker m;
    m.step = j.at("step").get<int64_t>();
    const std::string kind = j.at("kind").get<std::string>();
    if (kind != "full" && kind != "delta") return damaged("unknown kind");
    m.delta = kind == "delta";
    if (m.delta) m.base_step = j.at("base_step").get<int64_t>();
    m.world_size = j.at("world_size").get<int>();
    CKPT_ASSIGN_OR_RETURN(m.manifest_xxh3, internal::HashFromHex(j.at("manifest_xxh3").get<std::string>()));
    if (j.contains("compacted_from_manifest_xxh3")) {
      m.compacted = true;
      CKPT_ASSIGN_OR_RETURN(m.compacted_from_manifest_xxh3,
                            internal::HashFromHex(j["compacted_from_manifest_xxh3"].get<std::string>()));
    }
    const auto& files = j.at("files");
    if (!files.is_array() || files.size() > kMaxFiles) return damaged("bad file list");
    for (const auto& f : files) {
      CommitMarker::File file;
      file.name = f.at("name").get<std::string>();
      file.bytes = f.at("bytes").get<uint64_t>();
      CKPT_ASSIGN_OR_RETURN(file.xxh3, internal::HashFromHex(f.at("xxh3").get<std::string>()));
      if (!internal::IsSafeFileName(file.name) || file.bytes >= kMaxFileBytes) {
        return damaged(absl::StrCat("bad file entry \"", file.name, "\""));
      }
      m.files.push_back(std::move(file));
    }
    m.uploaded_by = j.value("uploaded_by", "");
    m.uploaded_unix_ns = j.value("uploaded_unix_ns", int64_t{0});
    if (m.step < 0 || m.world_size < 1 || (m.delta && (m.base_step < 0 || m.base_step >= m.step))) {
      return damaged("bad step, base step or world size");
    }
    return m;
  } catch (const nlohmann::json::exception& e) {
    return damaged(e.what());
  }
}

absl::StatusOr<std::optional<CommitMarker>> ReadCommitMarker(ObjectStore& store,
                                                             absl::string_view prefix,
                                                             int64_t step) {
  const std::string key = MarkerKey(prefix, step);
  auto text = store.Get(key);
  if (!text.ok()) {
    if (absl::IsNotFound(text.status())) return std::optional<CommitMarker>();
    return text.status();
  }
  CKPT_ASSIGN_OR_RETURN(CommitMarker marker,
                        ParseCommitMarker(*text, absl::StrCat("s3://", store.bucket(), "/", key)));
  if (marker.step != step) {
    return absl::DataLossError(absl::StrCat("commit marker s3://", store.bucket(), "/", key,
                                            " names step ", marker.step));
  }
  return std::optional<CommitMarker>(std::move(marker));
}

absl::StatusOr<std::vector<int64_t>> ListCommittedSteps(ObjectStore& store,
                                                        absl::string_view prefix) {
  const std::string dir = prefix.empty() ? "" : absl::StrCat(prefix, "/");
  CKPT_ASSIGN_OR_RETURN(ObjectListing listing, store.List(dir, "/"));
  std::vector<int64_t> steps;
  for (const ObjectInfo& o : listing.objects) {
    absl::string_view name = absl::string_view(o.key).substr(dir.size());
    if (!absl::ConsumeSuffix(&name, ".commit")) continue;
    if (auto step = internal::ParseCheckpointDirName(name)) steps.push_back(*step);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

}  // namespace ckpt
