// How a compacted checkpoint replaces the delta it was made from, or lands in
// another root; and the recovery of an interrupted two-rename swap.
#ifndef CKPT_COMPACT_SWAP_H_
#define CKPT_COMPACT_SWAP_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "ckpt/file_system.h"
#include "commit/publish.h"

namespace ckpt::internal {

// ROOT/.tmp-compact-<name>-<nonce>: a compaction being written (a `.tmp-`
// name: readers ignore it, retention removes it once stale).
inline constexpr absl::string_view kCompactTempPrefix = ".tmp-compact-";
// ROOT/.compact-old-<name>-<nonce>: the delta set aside by the two-rename
// fallback of `ReplaceDir` (commit/publish.h); see `FinishInterruptedCompactions`.
inline constexpr absl::string_view kCompactAsidePrefix = kReplaceAsidePrefix;

// Replaces the checkpoint directory ROOT/`name` (whose manifest must still
// have checksum `expected_hash`) with `temp`, a complete checkpoint
// directory in ROOT (`ReplaceDir`), then removes the old one (best effort).
// Sets `*how` to "exchange" or "rename". On error ROOT/`name` holds the old
// checkpoint again as far as possible, and `temp` (if it still exists) is
// the caller's to remove.
absl::Status SwapIntoPlace(FileSystem& fs, const std::string& root,
                           const std::string& name, const std::string& temp,
                           uint64_t expected_hash, std::string* how);

// Publishes `temp` (complete, in `target`) as `target`/`name`, which must
// not exist (`PublishDir`). On error nothing is left under `name`.
absl::Status CommitInto(FileSystem& fs, const std::string& target, const std::string& name,
                        const std::string& temp);

}  // namespace ckpt::internal

#endif  // CKPT_COMPACT_SWAP_H_
