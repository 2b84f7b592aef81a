#include "read/step_view.h"

#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "format/names.h"
#include "read/load_manifest.h"
#include "util/status_macros.h"

namespace ckpt::internal {

absl::StatusOr<StepView> LoadStepView(FileSystem& fs, const std::string& root, int64_t step,
                                      std::optional<int> rank, bool own_part_only) {
  const std::string dir = JoinPath(root, CheckpointDirName(step));
  own_part_only = own_part_only && rank.has_value();
  CKPT_ASSIGN_OR_RETURN(StepManifest manifest,
                        LoadStepManifest(fs, dir, step, own_part_only ? rank : std::nullopt));
  StepView view;
  view.step = step;
  view.dir = dir;
  if (!manifest.multi_rank) {
    if (rank.has_value() && *rank != 0) {
      return absl::NotFoundError(absl::StrCat("checkpoint ", dir, " was written by one process: it has no rank ",
                                              *rank, " (only rank 0)"));
    }
    CKPT_ASSIGN_OR_RETURN(DeltaChain chain,
                          DeltaChain::Load(fs, root, step, std::nullopt, std::move(manifest.single)));
    view.extras_json = chain.opened().manifest.extras_json;
    view.tensors = chain.opened().manifest.tensors;
    for (const TensorInfo& t : view.tensors) view.sources.push_back(TensorSource{0, t.name});
    view.parts.push_back(ReaderPart{0, std::move(chain)});
    return view;
  }
  const GlobalManifest& global = manifest.global;
  view.world_size = global.world_size;
  view.rank = rank.value_or(-1);
  if (rank.has_value() && (*rank < 0 || *rank >= global.world_size)) {
    return absl::NotFoundError(absl::StrCat("checkpoint ", dir, " has ranks 0..", global.world_size - 1,
                                            ", not rank ", *rank));
  }
  // The parts the view draws from: the rank's own first (its tensors come
  // first, in its order), then those holding replicated tensors or chunks of
  // sharded ones, by rank (every part, for the whole checkpoint).
  std::vector<int> ranks;
  if (rank.has_value()) ranks.push_back(*rank);
  for (int r = 0; r < global.world_size && !own_part_only; ++r) {
    bool shared = false;
    for (const TensorInfo& t : manifest.parts[r].tensors) {
      shared |= t.placement == TensorPlacement::kReplicated || t.placement == TensorPlacement::kSharded;
    }
    if (!rank.has_value() || (r != *rank && shared)) ranks.push_back(r);
  }
  view.parts.reserve(ranks.size());
  absl::flat_hash_set<std::string> names;
  for (int r : ranks) {
    CKPT_ASSIGN_OR_RETURN(DeltaChain chain,
                          DeltaChain::Load(fs, root, step, r, std::move(manifest.parts[r])));
    const size_t part = view.parts.size();
    const bool own = rank.has_value() && r == *rank;
    for (const TensorInfo& t : chain.opened().manifest.tensors) {
      if (t.placement == TensorPlacement::kSharded && !own_part_only) continue;  // shown whole, below
      const bool replicated = t.placement == TensorPlacement::kReplicated;
      if (rank.has_value() && !own && !replicated) continue;
      TensorInfo shown = t;
      shown.rank = r;
      if (!rank.has_value() && !replicated) shown.name = absl::StrCat("rank", r, "/", t.name);
      if (!names.insert(shown.name).second) {
        return absl::DataLossError(absl::StrCat("checkpoint ", dir, " holds tensor \"", shown.name,
                                                "\" twice (rank ", r, ")"));
      }
      view.sources.push_back(TensorSource{part, t.name});
      view.tensors.push_back(std::move(shown));
    }
    if (own) view.extras_json = chain.opened().manifest.extras_json;
    view.parts.push_back(ReaderPart{r, std::move(chain)});
  }
  if (!rank.has_value()) view.extras_json = global.extras_json;
  if (own_part_only) return view;
  // Each sharded tensor once, whole, from its chunks on every rank.
  std::vector<RankRecords> records;
  for (const ReaderPart& p : view.parts) records.push_back(RankRecords{p.rank, &p.chain.opened().manifest.tensors});
  absl::StatusOr<std::vector<GlobalTensor>> globals = GatherGlobalTensors(records);
  if (!globals.ok()) {
    return absl::DataLossError(absl::StrCat("checkpoint ", dir, ": ", globals.status().message()));
  }
  view.globals = std::move(*globals);
  for (size_t g = 0; g < view.globals.size(); ++g) {
    TensorInfo shown = GlobalTensorInfo(view.globals[g], records);
    if (!names.insert(shown.name).second) {
      return absl::DataLossError(absl::StrCat("checkpoint ", dir, " holds tensor \"", shown.name,
                                              "\" both sharded and whole"));
    }
    view.sources.push_back(TensorSource{0, shown.name, g});
    view.tensors.push_back(std::move(shown));
  }
  return view;
}

}  // namespace ckpt::internal
