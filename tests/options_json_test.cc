// The JSON form of EngineOptions (ckpt/options_json.h): one table read and
// written by the same rows, and the Name/Parse pair of every option enum.
#include "ckpt/options_json.h"

#include <set>

#include <gtest/gtest.h>

#include "absl/strings/match.h"

namespace ckpt {
namespace {

TEST(OptionsJsonTest, EveryKeyRoundTrips) {
  EngineOptions changed;
  changed.delta.mode = DeltaOptions::Mode::kTopK;
  changed.delta.topk_ratio = 0.25;
  changed.delta.full_every = 3;
  changed.delta.base = DeltaOptions::Base::kChained;
  changed.delta.max_restore_read_factor = 4.5;
  changed.delta.resume_from_newest = false;
  changed.lazy_staging = true;
  changed.write_during_eager_staging = true;
  changed.staging_bytes = 123 << 20;
  changed.staging_reserve_bytes = 7 << 20;
  changed.staging_threads = 3;
  changed.when_busy = EngineOptions::BusyPolicy::kSkip;
  changed.compression_level = 5;
  changed.compression.codec = CompressionCodec::kPlanes;
  changed.compression.adaptive = false;
  changed.compression.threads = 6;
  changed.io.backend = IoBackend::kThreads;
  changed.io.direct = DirectIoMode::kOff;
  changed.io.chunk_bytes = 64 << 10;
  changed.io.queue_depth = 9;
  changed.io.encode_buffers = 2;
  changed.shard_min_bytes = 1;
  changed.shard_max_bytes = 2 << 20;
  changed.create_root = false;
  changed.background_nice = 7;
  changed.watchdog_timeout = absl::Seconds(12.5);
  changed.stall_timeout = absl::Seconds(30);
  changed.metrics_jsonl_path = "/tmp/m.jsonl";
  changed.prometheus_textfile_path = "/tmp/p.prom";
  const std::string json = EngineOptionsJson(changed);
  EngineOptions read;
  ASSERT_TRUE(ApplyEngineOptionsJson(json, &read).ok()) << json;
  EXPECT_EQ(EngineOptionsJson(read), json);
  // And every key was written, so none was left at its default by accident.
  EngineOptions defaults;
  EXPECT_NE(EngineOptionsJson(defaults), json);
  for (const std::string& key : EngineOptionNames()) {
    EXPECT_TRUE(absl::StrContains(json, "\"" + key + "\":")) << key;
  }
}

TEST(OptionsJsonTest, KeysAreUnique) {
  const std::vector<std::string>& names = EngineOptionNames();
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()).size(), names.size());
  EXPECT_GE(names.size(), 29u);
}

TEST(OptionsJsonTest, AbsentNullAndEmptyKeepTheDefault) {
  EngineOptions options;
  options.io.queue_depth = 5;
  ASSERT_TRUE(ApplyEngineOptionsJson(R"({"queue_depth": null, "delta": ""})", &options).ok());
  EXPECT_EQ(options.io.queue_depth, 5u);
  EXPECT_EQ(options.delta.mode, DeltaOptions::Mode::kNone);
}

TEST(OptionsJsonTest, BackgroundNiceTakesMinusOneAsDocumented) {
  EngineOptions options;
  options.background_nice = 3;
  ASSERT_TRUE(ApplyEngineOptionsJson(R"({"background_nice": -1})", &options).ok());
  EXPECT_EQ(options.background_nice, -1);
}

TEST(OptionsJsonTest, RefusalsNameTheKey) {
  EngineOptions options;
  struct Case {
    const char* json;
    const char* says;
  };
  for (const Case& c : {Case{R"({"colour": 1})", "unknown engine option \"colour\""},
                        Case{R"({"lazy": "yes"})", "engine option \"lazy\" is \"yes\""},
                        Case{R"({"chunk_bytes": -1})", "engine option \"chunk_bytes\" is negative"},
                        Case{R"({"stall_timeout_s": -2})", "\"stall_timeout_s\" is negative"},
                        Case{R"({"io_backend": "spdk"})",
                             "\"io_backend\" is \"spdk\"; expected one of \"auto\", \"uring\", \"threads\""},
                        Case{R"([1, 2])", "must be a JSON object"},
                        Case{R"({"delta": 3})", "engine option \"delta\" is 3"}}) {
    absl::Status s = ApplyEngineOptionsJson(c.json, &options);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.json;
    EXPECT_TRUE(absl::StrContains(s.message(), c.says)) << c.json << ": " << s.message();
  }
}

// Each enum's names parse back to the value they name.
template <typename E>
void ExpectNamesRoundTrip(absl::string_view (*name)(E), std::optional<E> (*parse)(absl::string_view),
                          int expected_count) {
  int named = 0;
  for (int i = 0; i < 256; ++i) {
    const E value = static_cast<E>(i);
    if (name(value) == "unknown") continue;
    ++named;
    ASSERT_EQ(parse(name(value)), value) << name(value);
  }
  EXPECT_EQ(named, expected_count);
  EXPECT_FALSE(parse("no such name").has_value());
}

TEST(OptionsJsonTest, EveryOptionEnumHasANameAndParsesItBack) {
  ExpectNamesRoundTrip(DeltaModeName, ParseDeltaMode, 3);
  ExpectNamesRoundTrip(DeltaBaseName, ParseDeltaBase, 2);
  ExpectNamesRoundTrip(CompressionCodecName, ParseCompressionCodec, 3);
  ExpectNamesRoundTrip(IoBackendName, ParseIoBackend, 3);
  ExpectNamesRoundTrip(DirectIoModeName, ParseDirectIoMode, 3);
  ExpectNamesRoundTrip(BusyPolicyName, ParseBusyPolicy, 2);
}

}  // namespace
}  // namespace ckpt
