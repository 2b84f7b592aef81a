// `StepView`: what a reader shows of one step — the delta chains of the
// parts it draws from (one, or some ranks' of a multi-rank checkpoint) and
// the tensors it lists, each traced to the record (or chunks) it comes from.
#ifndef CKPT_READ_STEP_VIEW_H_
#define CKPT_READ_STEP_VIEW_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ckpt/file_system.h"
#include "ckpt/reader.h"
#include "format/global_tensors.h"
#include "read/delta_chain.h"

namespace ckpt::internal {

// One delta chain a reader draws tensors from: a single-process
// checkpoint's, or one rank's part of a multi-rank one.
struct ReaderPart {
  int rank = 0;
  DeltaChain chain;
};

// Where a tensor the reader shows comes from: one part's record, or (a
// sharded tensor) the chunks of `StepView::globals[global]`.
struct TensorSource {
  size_t part = 0;
  std::string name;  // its name in that part
  size_t global = SIZE_MAX;
};

// What a reader shows of one step: the parts it reads and its tensors.
struct StepView {
  int64_t step = 0;
  std::string dir;
  std::string extras_json;
  int world_size = 1;
  int rank = 0;  // -1: every rank's part
  std::vector<ReaderPart> parts;
  std::vector<TensorInfo> tensors;
  std::vector<TensorSource> sources;  // parallel to `tensors`
  std::vector<GlobalTensor> globals;   // pieces index `parts`
};

// The view of step `step` of `root` for `rank` (see ReaderOptions::rank).
// `own_part_only` (with `rank`): the tensors of that rank's own part alone,
// its chunks of sharded tensors shown as they are, under their names; the
// other parts are not read (a rank's copy of a step when the ranks share no
// ROOT, whose delta reference is rebuilt from it).
absl::StatusOr<StepView> LoadStepView(FileSystem& fs, const std::string& root, int64_t step,
                                      std::optional<int> rank, bool own_part_only = false);

}  // namespace ckpt::internal

#endif  // CKPT_READ_STEP_VIEW_H_
