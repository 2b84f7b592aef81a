// maintenance_ops.cc: `torch.ops.ckpt.checkpoint_bases` and
// `torch.ops.ckpt.remove_checkpoint`, over ckpt/catalog.h and
// ckpt/maintenance.h: what integrations that delete checkpoints (Lightning's
// top-k) need to keep every delta chain whole.
#include <cstdint>
#include <string>
#include <unistd.h>
#include <tuple>
#include <vector>

#include <torch/library.h>

#include "absl/strings/str_cat.h"
#include "ckpt/catalog.h"
#include "ckpt/maintenance.h"
#include "ckpt/object_store.h"
#include "ckpt/object_tier.h"
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

// Publishes committed step `step` of `root` to the bucket prefix `url`
// (ckpt/object_tier.h), holding the prefix's lease meanwhile: what
// `Checkpointer(root, tier=url)` runs behind the saves. Returns the files and
// bytes sent and whether the step was already there.
std::tuple<int64_t, int64_t, bool> PublishCheckpointOp(std::string root, int64_t step, std::string url,
                                                       int64_t streams, int64_t part_bytes,
                                                       int64_t max_send_bytes_per_second) {
  const std::string what = absl::StrCat("ckpt: upload of step ", step, " to ", url, ": ");
  auto parsed = ParseObjectUrl(url);
  ThrowIfError(parsed.status(), what);
  ObjectStoreOptions options;
  options.max_send_bytes_per_second = max_send_bytes_per_second;
  auto store = OpenObjectStore(url, options);
  ThrowIfError(store.status(), what);
  auto lease = ObjectLease::Acquire(*store, parsed->prefix,
                                    absl::StrCat("ckpt Checkpointer pid ", getpid(), " for ", root),
                                    absl::Hours(1));
  ThrowIfError(lease.status(), what);
  PublishOptions publish;
  publish.streams = static_cast<int>(streams);
  publish.part_bytes = static_cast<uint64_t>(part_bytes);
  auto stats = PublishCheckpoint(root, step, **store, parsed->prefix, publish);
  ThrowIfError(stats.status(), what);
  return {static_cast<int64_t>(stats->files), static_cast<int64_t>(stats->bytes), stats->already_there};
}

}  // namespace
}  // namespace ckpt::torch_ext

TORCH_LIBRARY_FRAGMENT(ckpt, m) {
  using namespace ckpt::torch_ext;
  m.def("checkpoint_bases(str root) -> (int[], int[])", CheckpointBasesOp);
  m.def("remove_checkpoint(str root, int step) -> ()", RemoveCheckpointOp);
  m.def("publish_checkpoint(str root, int step, str url, int streams, int part_bytes, "
        "int max_send_bytes_per_second) -> (int, int, bool)",
        PublishCheckpointOp);
}
