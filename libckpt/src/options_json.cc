// The JSON form of EngineOptions: one table, one row per key, read and
// written by the same row.
#include "ckpt/options_json.h"

#include <cstdint>
#include <optional>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "util/status_macros.h"

namespace ckpt {
namespace {

using Json = nlohmann::ordered_json;

absl::Status Wrong(absl::string_view key, const Json& value, absl::string_view expected) {
  return absl::InvalidArgumentError(
      absl::StrCat("engine option \"", key, "\" is ", value.dump(), "; expected ", expected));
}

// How each kind of field is read from and written as JSON.
struct Flag {
  static absl::Status Read(absl::string_view key, const Json& v, bool* out) {
    if (!v.is_boolean()) return Wrong(key, v, "true or false");
    *out = v.get<bool>();
    return absl::OkStatus();
  }
  static Json Write(bool v) { return v; }
};

// Any integer (`Engine::Open` checks the range).
struct Integer {
  static absl::Status Read(absl::string_view key, const Json& v, int* out) {
    if (!v.is_number()) return Wrong(key, v, "an integer");
    *out = static_cast<int>(v.get<int64_t>());
    return absl::OkStatus();
  }
  static Json Write(int v) { return v; }
};

// A count or a size: a non-negative integer.
struct Count {
  template <typename T>
  static absl::Status Read(absl::string_view key, const Json& v, T* out) {
    if (!v.is_number()) return Wrong(key, v, "a non-negative integer");
    const int64_t n = v.get<int64_t>();
    if (n < 0) return absl::InvalidArgumentError(absl::StrCat("engine option \"", key, "\" is negative"));
    *out = static_cast<T>(n);
    return absl::OkStatus();
  }
  template <typename T>
  static Json Write(T v) { return static_cast<uint64_t>(v); }
};

struct Real {
  static absl::Status Read(absl::string_view key, const Json& v, double* out) {
    if (!v.is_number()) return Wrong(key, v, "a number");
    *out = v.get<double>();
    return absl::OkStatus();
  }
  static Json Write(double v) { return v; }
};

// A duration, in seconds (a non-negative number).
struct Seconds {
  static absl::Status Read(absl::string_view key, const Json& v, absl::Duration* out) {
    if (!v.is_number()) return Wrong(key, v, "a number of seconds");
    const double s = v.get<double>();
    if (s < 0) return absl::InvalidArgumentError(absl::StrCat("engine option \"", key, "\" is negative"));
    *out = absl::Seconds(s);
    return absl::OkStatus();
  }
  static Json Write(absl::Duration v) { return absl::ToDoubleSeconds(v); }
};

struct Text {
  static absl::Status Read(absl::string_view key, const Json& v, std::string* out) {
    if (!v.is_string()) return Wrong(key, v, "a string");
    *out = v.get<std::string>();
    return absl::OkStatus();
  }
  static Json Write(const std::string& v) { return v; }
};

// An enum by the name its Name/Parse pair (ckpt/options.h) gives it.
template <typename E, absl::string_view (*kName)(E), std::optional<E> (*kParse)(absl::string_view)>
struct Choice {
  static absl::Status Read(absl::string_view key, const Json& v, E* out) {
    if (!v.is_string()) return Wrong(key, v, "a string");
    const std::string text = v.get<std::string>();
    if (text.empty()) return absl::OkStatus();
    if (std::optional<E> parsed = kParse(text); parsed.has_value()) {
      *out = *parsed;
      return absl::OkStatus();
    }
    std::string allowed;
    for (int i = 0; i < 256; ++i) {  // every value that has a name
      const absl::string_view name = kName(static_cast<E>(i));
      if (name != "unknown") absl::StrAppend(&allowed, allowed.empty() ? "" : ", ", "\"", name, "\"");
    }
    return absl::InvalidArgumentError(absl::StrCat("engine option \"", key, "\" is \"", text,
                                                   "\"; expected one of ", allowed));
  }
  static Json Write(E v) { return std::string(kName(v)); }
};

using DeltaModeChoice = Choice<DeltaOptions::Mode, DeltaModeName, ParseDeltaMode>;
using DeltaBaseChoice = Choice<DeltaOptions::Base, DeltaBaseName, ParseDeltaBase>;
using CodecChoice = Choice<CompressionCodec, CompressionCodecName, ParseCompressionCodec>;
using BusyChoice = Choice<EngineOptions::BusyPolicy, BusyPolicyName, ParseBusyPolicy>;
using BackendChoice = Choice<IoBackend, IoBackendName, ParseIoBackend>;
using DirectChoice = Choice<DirectIoMode, DirectIoModeName, ParseDirectIoMode>;

struct OptionField {
  absl::string_view key;
  absl::Status (*read)(absl::string_view key, const Json& value, EngineOptions* options);
  Json (*write)(const EngineOptions& options);
};

// One row: `key` is field `member` of EngineOptions, of kind `Kind`.
#define CKPT_OPTION(key, Kind, member)                                                        \
  OptionField {                                                                               \
    key,                                                                                      \
        [](absl::string_view k, const Json& v, EngineOptions* o) { return Kind::Read(k, v, &o->member); }, \
        [](const EngineOptions& o) -> Json { return Kind::Write(o.member); }                  \
  }

// The table (docs/options.md lists the keys in this order).
const OptionField kOptionFields[] = {
    CKPT_OPTION("delta", DeltaModeChoice, delta.mode),
    CKPT_OPTION("topk_ratio", Real, delta.topk_ratio),
    CKPT_OPTION("full_every", Integer, delta.full_every),
    CKPT_OPTION("delta_base", DeltaBaseChoice, delta.base),
    CKPT_OPTION("max_restore_read_factor", Real, delta.max_restore_read_factor),
    CKPT_OPTION("resume_deltas", Flag, delta.resume_from_newest),
    CKPT_OPTION("lazy", Flag, lazy_staging),
    CKPT_OPTION("write_during_eager_staging", Flag, write_during_eager_staging),
    CKPT_OPTION("staging_bytes", Count, staging_bytes),
    CKPT_OPTION("staging_reserve_bytes", Count, staging_reserve_bytes),
    CKPT_OPTION("staging_threads", Count, staging_threads),
    CKPT_OPTION("when_busy", BusyChoice, when_busy),
    CKPT_OPTION("compression_level", Integer, compression_level),
    CKPT_OPTION("compression_codec", CodecChoice, compression.codec),
    CKPT_OPTION("adaptive_compression", Flag, compression.adaptive),
    CKPT_OPTION("encode_threads", Count, compression.threads),
    CKPT_OPTION("io_backend", BackendChoice, io.backend),
    CKPT_OPTION("direct_io", DirectChoice, io.direct),
    CKPT_OPTION("chunk_bytes", Count, io.chunk_bytes),
    CKPT_OPTION("queue_depth", Count, io.queue_depth),
    CKPT_OPTION("encode_buffers", Count, io.encode_buffers),
    CKPT_OPTION("shard_min_bytes", Count, shard_min_bytes),
    CKPT_OPTION("shard_max_bytes", Count, shard_max_bytes),
    CKPT_OPTION("create_root", Flag, create_root),
    // -1 (automatic) or 0..19: `Engine::Open` checks it.
    CKPT_OPTION("background_nice", Integer, background_nice),
    CKPT_OPTION("watchdog_timeout_s", Seconds, watchdog_timeout),
    CKPT_OPTION("stall_timeout_s", Seconds, stall_timeout),
    CKPT_OPTION("metrics_jsonl_path", Text, metrics_jsonl_path),
    CKPT_OPTION("prometheus_textfile_path", Text, prometheus_textfile_path),
};

#undef CKPT_OPTION

const OptionField* FindField(absl::string_view key) {
  for (const OptionField& f : kOptionFields) {
    if (f.key == key) return &f;
  }
  return nullptr;
}

}  // namespace

const std::vector<std::string>& EngineOptionNames() {
  static const std::vector<std::string>* const kNames = [] {
    auto* names = new std::vector<std::string>;
    for (const OptionField& f : kOptionFields) names->emplace_back(f.key);
    return names;
  }();
  return *kNames;
}

absl::Status ApplyEngineOptionsJson(absl::string_view json, EngineOptions* options) {
  const Json obj = Json::parse(json.begin(), json.end(), nullptr, /*allow_exceptions=*/false);
  if (!obj.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("engine options must be a JSON object, got: ", json));
  }
  for (const auto& item : obj.items()) {
    if (FindField(item.key()) == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown engine option \"", item.key(), "\""));
    }
  }
  // In table order, so that the first error named is the same whatever the
  // object's order.
  for (const OptionField& f : kOptionFields) {
    auto it = obj.find(std::string(f.key));
    if (it == obj.end() || it->is_null()) continue;
    CKPT_RETURN_IF_ERROR(f.read(f.key, *it, options));
  }
  return absl::OkStatus();
}

std::string EngineOptionsJson(const EngineOptions& options) {
  Json obj = Json::object();
  for (const OptionField& f : kOptionFields) obj[std::string(f.key)] = f.write(options);
  return obj.dump();
}

}  // namespace ckpt
