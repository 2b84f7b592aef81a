// Loading and checking the manifest of one committed checkpoint directory.
#ifndef CKPT_READ_LOAD_MANIFEST_H_
#define CKPT_READ_LOAD_MANIFEST_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "ckpt/file_system.h"
#include "format/manifest.h"

namespace ckpt::internal {

// Reads and parses `dir`/MANIFEST.json, checks that its step is
// `expected_step`, and that every shard file exists with exactly the size
// the manifest records (a truncated or extended shard is kDataLoss naming
// it). Does not read tensor data.
absl::StatusOr<Manifest> LoadManifest(FileSystem& fs, const std::string& dir,
                                      int64_t expected_step);

}  // namespace ckpt::internal

#endif  // CKPT_READ_LOAD_MANIFEST_H_
