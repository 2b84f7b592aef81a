// Names: tensor names (user data, never paths) and the file names derived
// from them, checkpoint directory names, the names of a multi-rank
// checkpoint's per-rank files.
#ifndef CKPT_FORMAT_NAMES_H_
#define CKPT_FORMAT_NAMES_H_

#include <cstdint>
#include <optional>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "util/path.h"  // JoinPath, for every user of these names

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

// World sizes up to this are accepted (rank numbers have 5 digits in names).
inline constexpr int kMaxWorldSize = 100000;
// "rank-00003.MANIFEST.json": rank 3's manifest in a multi-rank checkpoint.
std::string RankManifestName(int rank);
// "rank-00003.": what rank 3's shard file names start with.
std::string RankFilePrefix(int rank);
// ".tmp-step-<20 digits>-<nonce>-<attempt>": the temp directory every rank of
// a multi-rank save writes into. `nonce` is the one rank 0 published when
// the engines opened; `attempt` counts the saves of `step` this engine
// started (all ranks count alike).
std::string MultiRankTempDirName(int64_t step, absl::string_view nonce, int attempt);

}  // namespace ckpt::internal

#endif  // CKPT_FORMAT_NAMES_H_
