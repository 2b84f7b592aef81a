// The JSON objects behind ckpt/json.h, for internal callers that put them
// into larger documents (the manifest, the metrics line).
#ifndef CKPT_FORMAT_JSON_FORMS_H_
#define CKPT_FORMAT_JSON_FORMS_H_

#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"

#include "ckpt/engine.h"
#include "ckpt/reader.h"

namespace ckpt::internal {

nlohmann::ordered_json SaveStatsObject(const SaveStats& stats);
nlohmann::ordered_json EngineStatsObject(const EngineStats& stats);
nlohmann::ordered_json TensorInfoObject(const TensorInfo& tensor);

// `object` as compact text; invalid UTF-8 in a string (a path) is replaced,
// never thrown.
std::string DumpJson(const nlohmann::ordered_json& object);

// A manifest's "extras": `extras_json` parsed, kInvalidArgument unless it is
// a JSON object.
absl::StatusOr<nlohmann::ordered_json> ExtrasObject(const std::string& extras_json);

}  // namespace ckpt::internal

#endif  // CKPT_FORMAT_JSON_FORMS_H_
