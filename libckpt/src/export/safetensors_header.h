// The header of a safetensors file, with the metadata its writer chooses
// (`ckpt/safetensors.h` documents the layout and the errors).
#ifndef CKPT_EXPORT_SAFETENSORS_HEADER_H_
#define CKPT_EXPORT_SAFETENSORS_HEADER_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "ckpt/reader.h"

namespace ckpt::internal {

// `SafetensorsHeader` with "__metadata__" holding `metadata` (string keys
// and values, in this order) instead of ckpt's step and extras. Each
// tensor's `name`, `dtype`, `shape` and `raw_bytes` are what is written.
absl::StatusOr<std::string> SafetensorsHeaderWith(
    const std::vector<const TensorInfo*>& tensors,
    const std::vector<std::pair<std::string, std::string>>& metadata);

}  // namespace ckpt::internal

#endif  // CKPT_EXPORT_SAFETENSORS_HEADER_H_
