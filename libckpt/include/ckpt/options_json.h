// ckpt/options_json.h: the JSON form of `EngineOptions`, the one mapping
// between option keys and fields that every binding uses (the LibTorch
// extension's `Engine(root, options_json)`, the Python package's
// `Checkpointer(**options)`); docs/options.md lists the keys, checked
// against `EngineOptionNames()` by a test.
//
//   {"delta": "exact", "compression_codec": "planes", "chunk_bytes": 1048576,
//    "watchdog_timeout_s": 300, ...}
//
// A key absent or null leaves the field as it is; an enum's value is its
// name (ckpt/options.h: `DeltaModeName`, ...), "" leaving it as it is.
#ifndef CKPT_OPTIONS_JSON_H_
#define CKPT_OPTIONS_JSON_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "ckpt/options.h"

namespace ckpt {

// Every key, in the order of the table (docs/options.md's order).
const std::vector<std::string>& EngineOptionNames();

// Sets the fields of `options` that the JSON object `json` names.
// kInvalidArgument, naming the key, for text that is not a JSON object, an
// unknown key, a value of the wrong type, an unknown enum name, or a
// negative count or size; ranges are checked by `Engine::Open`.
absl::Status ApplyEngineOptionsJson(absl::string_view json, EngineOptions* options);

// Every key of `options` with its value, as `ApplyEngineOptionsJson` reads
// it (durations in seconds).
std::string EngineOptionsJson(const EngineOptions& options);

}  // namespace ckpt

#endif  // CKPT_OPTIONS_JSON_H_
