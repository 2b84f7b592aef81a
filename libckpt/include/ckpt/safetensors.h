// ckpt/safetensors.h: one checkpoint step as a standard safetensors file
// (what `ckpt-restore --out` writes), for tools that read those.
#ifndef CKPT_SAFETENSORS_H_
#define CKPT_SAFETENSORS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ckpt/file_system.h"
#include "ckpt/reader.h"

namespace ckpt {

struct ExportResult {
  size_t tensors = 0;
  uint64_t bytes = 0;  // file size
};

// The start of a safetensors file holding `tensors` in this order: the
// 8-byte little-endian header length, then the JSON header (dtype, shape,
// data_offsets per tensor; "__metadata__" holds "format": "pt", "ckpt_step"
// (the step as a decimal string) and "ckpt_extras" (`extras_json`)) padded with spaces so that the data starts 8-byte aligned.
// kInvalidArgument naming the tensor for what safetensors cannot hold (a
// name that is not valid UTF-8 or is "__metadata__", a duplicate name, a
// dtype it has no name for, a shape whose byte count does not match
// `raw_bytes`); and for extras that are not valid UTF-8.
absl::StatusOr<std::string> SafetensorsHeader(const std::vector<const TensorInfo*>& tensors,
                                              int64_t step, absl::string_view extras_json);

// Writes the tensors of `reader` (deltas resolved, every checksum verified)
// whose names start with `prefix` to `path` in the safetensors format (see
// `SafetensorsHeader`), then the raw bytes. Written to a temp file beside
// `path`, fsynced, then renamed into place (never over an existing file)
// and the directory fsynced: `path` is either complete or untouched, and
// nothing is left behind on failure. kInvalidArgument if nothing matches
// `prefix`; kAlreadyExists if `path` exists; file-system errors keep their
// code (a full disk is kResourceExhausted). `progress`, when set, is called
// with (0, total) once the tensors are selected and with (done, total) after
// each tensor is written, counting the raw bytes of the selected tensors.
// Every file-system call goes through `fs` (null: `PosixFileSystem()`).
absl::StatusOr<ExportResult> ExportSafetensors(
    Reader& reader, const std::string& prefix, const std::string& path,
    const std::function<void(uint64_t done, uint64_t total)>& progress = {},
    std::shared_ptr<FileSystem> fs = nullptr);

}  // namespace ckpt

#endif  // CKPT_SAFETENSORS_H_
