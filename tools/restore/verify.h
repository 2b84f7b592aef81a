// tools/restore/verify.h: verifying checkpoints with ckpt-restore's progress
// bar. The checking itself is the library's (`Reader::Verify`); this only
// counts its progress on the bar.
#ifndef CKPT_TOOLS_RESTORE_VERIFY_H_
#define CKPT_TOOLS_RESTORE_VERIFY_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "ckpt/reader.h"
#include "restore/progress_bar.h"

namespace ckpt::tools {

// `OpenStep` opens checkpoint `step` of `root`: its manifest and, for a
// delta, every base's manifest down to a full checkpoint are checked (a
// missing or replaced base is kDataLoss naming it); no tensor data is read.
// `rank` picks one rank's part of a multi-rank checkpoint (unset: the whole
// of it, every rank's manifest checked); a rank the checkpoint does not have
// is kNotFound (a single-process checkpoint has rank 0 alone).
absl::StatusOr<std::unique_ptr<Reader>> OpenStep(const std::string& root, int64_t step,
                                                 std::optional<int> rank = std::nullopt);

// `VerifyStep` opens checkpoint `step`, the whole of it (every rank's part
// of a multi-rank one), and verifies it (`Reader::Verify`),
// counting the tensor bytes checked on `bar` when it is drawn. Whatever
// happens, the bar advances by exactly `budget` bytes (the checkpoint's
// tensor bytes, from `TensorBytesByStep`): a failure counts the bytes it
// left unread as done, so that a run over many checkpoints ends at 100%.
absl::StatusOr<std::unique_ptr<Reader>> VerifyStep(const std::string& root, int64_t step,
                                                   ProgressBar& bar, uint64_t budget);

// `TensorBytesByStep` is the tensor bytes of every committed checkpoint of
// `root` whose manifest reads, from the manifests: the totals a progress bar
// needs before it starts. Empty when `bar` is disabled (nothing is read) or
// the root cannot be listed.
std::map<int64_t, uint64_t> TensorBytesByStep(const std::string& root, const ProgressBar& bar);

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_RESTORE_VERIFY_H_
