// ckpt/json.h: the one JSON form of each public type that programs print.
//
// Members are named as the fields (ckpt/engine.h, ckpt/reader.h). The
// metrics JSON lines, the Python package's stats and describe() dicts,
// ckpt-restore --json and the manifests themselves (for tensors) all use
// these forms, so a key means the same everywhere.
#ifndef CKPT_JSON_H_
#define CKPT_JSON_H_

#include <string>

#include "ckpt/engine.h"
#include "ckpt/reader.h"

namespace ckpt {

// {"step": 7, "dir": "...", "skipped": false, "kind": "full", ...}: one
// member per field of `SaveStats`, compact, in declaration order.
std::string SaveStatsJson(const SaveStats& stats);

// One member per field of `EngineStats`; "last" is `SaveStatsJson(last)`.
std::string EngineStatsJson(const EngineStats& stats);

// A tensor as the manifest records it (docs/format.md): "name", "dtype",
// "shape", "shard", "offset", "raw_bytes", "stored_bytes", "encoding",
// "xxh3" (16 lowercase hex digits) and "error_bound" (0 when exact; the
// manifest itself leaves it out then).
std::string TensorInfoJson(const TensorInfo& tensor);

}  // namespace ckpt

#endif  // CKPT_JSON_H_
