// Names: tensor names (user data, never paths) and the file names derived
// from them, checkpoint directory names.
#ifndef CKPT_FORMAT_NAMES_H_
#define CKPT_FORMAT_NAMES_H_

#include <cstdint>
#include <optional>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"

namespace ckpt::internal {

inline constexpr size_t kMaxTensorNameBytes = 16 * 1024;

// OK for a non-empty, valid UTF-8 name without NUL of at most
// `kMaxTensorNameBytes`; otherwise kInvalidArgument saying what is wrong.
// '/' and ".." are allowed: names never become paths.
absl::Status ValidateTensorName(absl::string_view name);

// The module a tensor belongs to: its name up to the last '.' or '/'
// ("layers.0.attn.q.weight" -> "layers.0.attn.q"), or "" for a bare name.
absl::string_view ModuleOf(absl::string_view name);

// A file-name fragment from `text`: [A-Za-z0-9_.-] kept (no leading '.', no
// "..", at most 64 bytes), everything else '_'; "tensors" for "".
std::string SanitizeFileNamePart(absl::string_view text);

// True for a plain file name inside a checkpoint directory: non-empty, at
// most 255 bytes, no '/', no NUL, not starting with '.'.
bool IsSafeFileName(absl::string_view name);

// "step-" followed by the step as 20 zero-padded digits.
std::string CheckpointDirName(int64_t step);
// The step of a committed checkpoint directory name, or nullopt for any
// other name (temp and trash directories included).
std::optional<int64_t> ParseCheckpointDirName(absl::string_view name);
// `prefix` `name` "-" and 16 random hex digits: a fresh name for a temp,
// trash or set-aside entry of `name` (".trash-step-…-3f2a…"). Thread-safe.
std::string UniqueName(absl::string_view prefix, absl::string_view name);
// ".tmp-step-<20 digits>-<nonce>": a save in progress; never read.
std::string TempDirName(int64_t step, uint64_t nonce);
inline constexpr absl::string_view kTempPrefix = ".tmp-";
inline constexpr absl::string_view kTrashPrefix = ".trash-";
inline constexpr absl::string_view kManifestName = "MANIFEST.json";
inline constexpr absl::string_view kLatestName = "LATEST";

std::string JoinPath(absl::string_view dir, absl::string_view name);

}  // namespace ckpt::internal

#endif  // CKPT_FORMAT_NAMES_H_
