// Fuzzes the name parsers that see what is on disk: checkpoint directory
// names (every entry of ROOT, and LATEST's contents), tensor names from
// manifests, file-name checks and checksum hex.
#include <cstddef>
#include <cstdint>
#include <string>

#include "format/names.h"
#include "util/hash.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  if (auto step = ckpt::internal::ParseCheckpointDirName(text); step.has_value()) {
    // Round trip: a name that parses is the canonical name of its step.
    if (*step < 0 || ckpt::internal::CheckpointDirName(*step) != text) __builtin_trap();
  }
  (void)ckpt::internal::ValidateTensorName(text);
  if (ckpt::internal::IsSafeFileName(text)) {
    if (text.find('/') != std::string::npos || text.empty() || text[0] == '.') __builtin_trap();
  }
  (void)ckpt::internal::SanitizeFileNamePart(text);
  (void)ckpt::internal::HashFromHex(text);
  return 0;
}
