// A rank's copy of its steps, when the ranks of a multi-rank checkpoint
// share no ROOT (`DistributedOptions::shared_root = false`): each step there
// holds the checkpoint's manifest and this rank's files only, so
// `Reader::Open` and `SummarizeCheckpoint`, which need every part, find no
// readable step in it. These read such a copy.
#ifndef CKPT_READ_RANK_COPY_H_
#define CKPT_READ_RANK_COPY_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "ckpt/catalog.h"
#include "ckpt/file_system.h"
#include "ckpt/options.h"
#include "ckpt/reader.h"

namespace ckpt::internal {

// As `Reader::Open(root, options)` (`options.rank` required), but the view
// is the tensors rank `*options.rank` saved itself, read from its own part
// and the chain of its own parts of the base steps; the replicated tensors
// other ranks wrote are not in it, and its chunks of sharded tensors are
// shown as they are, under their names (read them whole, with ReadInto).
absl::StatusOr<std::unique_ptr<Reader>> OpenOwnPart(const std::string& root, const ReaderOptions& options);

// As `SummarizeCheckpoint(root, step, fs)` for rank `rank`'s copy of step
// `step`: the checkpoint's kind, base, world size and manifest checksum; the
// sizes and counts are those of this rank's part alone.
absl::StatusOr<CheckpointSummary> SummarizeRankCopy(const std::string& root, int64_t step,
                                                    std::shared_ptr<FileSystem> fs, int rank);

}  // namespace ckpt::internal

#endif  // CKPT_READ_RANK_COPY_H_
