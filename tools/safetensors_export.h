// Writing one checkpoint step as a standard safetensors file.
#ifndef CKPT_TOOLS_SAFETENSORS_EXPORT_H_
#define CKPT_TOOLS_SAFETENSORS_EXPORT_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "ckpt/reader.h"

namespace ckpt::tools {

struct ExportResult {
  size_t tensors = 0;
  uint64_t bytes = 0;  // file size
};

// Writes the tensors of `reader` (deltas resolved, every checksum verified)
// whose names start with `prefix` to `path` in the safetensors format: an
// 8-byte little-endian header length, a JSON header (dtype, shape,
// data_offsets per tensor; "__metadata__" holds the step and the extras as
// strings), then the raw bytes. Written to a temp file beside `path`, fsynced,
// then renamed into place: `path` is either complete or untouched.
// kInvalidArgument if nothing matches `prefix`; kAlreadyExists if `path`
// exists (never overwritten). `progress`, when set, is called with (0, total)
// once the tensors are selected and with (done, total) after each tensor is
// written, counting the raw bytes of the selected tensors.
absl::StatusOr<ExportResult> ExportSafetensors(
    Reader& reader, const std::string& prefix, const std::string& path,
    const std::function<void(uint64_t done, uint64_t total)>& progress = {});

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_SAFETENSORS_EXPORT_H_
