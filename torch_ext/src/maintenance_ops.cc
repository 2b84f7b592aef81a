// maintenance_ops.cc: `torch.ops.ckpt.checkpoint_bases` and
// `torch.ops.ckpt.remove_checkpoint`, over ckpt/catalog.h and
// ckpt/maintenance.h: what integrations that delete checkpoints (Lightning's
// top-k) need to keep every delta chain whole.
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include <torch/library.h>

#include "absl/strings/str_cat.h"
#include "ckpt/catalog.h"
#include "ckpt/maintenance.h"
#include "torch_status.h"

namespace ckpt::torch_ext {
namespace {

// The committed steps of `root`, ascending, and for each the step its delta
// applies to (-1: a full checkpoint; -2: a manifest that does not read back,
// whose base is unknown).
std::tuple<std::vector<int64_t>, std::vector<int64_t>> CheckpointBasesOp(std::string root) {
  auto listed = ListCheckpoints(root);
  ThrowIfError(listed.status(), absl::StrCat("ckpt: list ", root, ": "));
  std::vector<int64_t> steps, bases;
  for (const CheckpointSummary& c : *listed) {
    steps.push_back(c.step);
    bases.push_back(!c.manifest_status.ok() ? -2 : c.kind == CheckpointKind::kDelta ? c.base_step : -1);
  }
  return {std::move(steps), std::move(bases)};
}

void RemoveCheckpointOp(std::string root, int64_t step) {
  ThrowIfError(RemoveCheckpoint(root, step), absl::StrCat("ckpt: remove step ", step, " of ", root, ": "));
}

}  // namespace
}  // namespace ckpt::torch_ext

TORCH_LIBRARY_FRAGMENT(ckpt, m) {
  using namespace ckpt::torch_ext;
  m.def("checkpoint_bases(str root) -> (int[], int[])", CheckpointBasesOp);
  m.def("remove_checkpoint(str root, int step) -> ()", RemoveCheckpointOp);
}
