#include "distributed/store_value.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"

namespace ckpt::internal {
namespace {

using Json = nlohmann::json;

constexpr std::pair<Verdict, const char*> kVerdictNames[] = {
    {Verdict::kCommit, "commit"},       {Verdict::kCommitMixedKinds, "commit_mixed_kinds"},
    {Verdict::kAbort, "abort"},         {Verdict::kCommitted, "committed"},
    {Verdict::kCommitFailed, "commit_failed"}, {Verdict::kDelta, "delta"},
    {Verdict::kFull, "full"},
};

const char* VerdictName(Verdict verdict) {
  for (const auto& [v, name] : kVerdictNames) {
    if (v == verdict) return name;
  }
  return "unknown";
}

bool CarriesStatus(Verdict v) { return v == Verdict::kAbort || v == Verdict::kCommitFailed; }
bool CarriesText(Verdict v) { return v == Verdict::kDelta || v == Verdict::kFull; }

}  // namespace

std::string EncodeStoreValue(const StoreValue& value) {
  Json j = {{"verdict", VerdictName(value.verdict)}};
  if (CarriesStatus(value.verdict)) {
    j["code"] = static_cast<int>(value.status.code());
    j["message"] = std::string(value.status.message());
  }
  if (CarriesText(value.verdict)) j["text"] = value.text;
  return j.dump();
}

absl::StatusOr<StoreValue> DecodeStoreValue(absl::string_view text, absl::string_view what) {
  const auto unreadable = [&] {
    return absl::InternalError(absl::StrCat("unreadable ", what, " in the coordination store: ", text));
  };
  const Json j = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("verdict") || !j["verdict"].is_string()) return unreadable();
  StoreValue value;
  bool known = false;
  for (const auto& [v, name] : kVerdictNames) {
    if (j["verdict"].get<std::string>() == name) {
      value.verdict = v;
      known = true;
    }
  }
  if (!known) return unreadable();
  if (CarriesStatus(value.verdict)) {
    if (!j.contains("code") || !j["code"].is_number_integer() || !j.contains("message") ||
        !j["message"].is_string()) {
      return unreadable();
    }
    const int64_t code = j["code"].get<int64_t>();
    if (code <= 0 || code > static_cast<int>(absl::StatusCode::kUnauthenticated)) return unreadable();
    value.status = absl::Status(static_cast<absl::StatusCode>(code), j["message"].get<std::string>());
  }
  if (CarriesText(value.verdict)) {
    if (!j.contains("text") || !j["text"].is_string()) return unreadable();
    value.text = j["text"].get<std::string>();
  }
  return value;
}

}  // namespace ckpt::internal
