// Where a multi-rank checkpoint puts each rank's files, and which rank
// writes each replicated tensor.
#ifndef CKPT_DISTRIBUTED_RANK_LAYOUT_H_
#define CKPT_DISTRIBUTED_RANK_LAYOUT_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "ckpt/tensor.h"

namespace ckpt::internal {

// World sizes up to this are accepted (rank numbers have 5 digits in names).
inline constexpr int kMaxWorldSize = 100000;

// "rank-00003.MANIFEST.json": rank 3's manifest in a multi-rank checkpoint.
std::string RankManifestName(int rank);
// The rank a `RankManifestName` names, or nullopt.
std::optional<int> ParseRankManifestName(absl::string_view name);
// "rank-00003.": what rank 3's shard file names start with.
std::string RankFilePrefix(int rank);
// ".tmp-step-<20 digits>-<nonce>-<attempt>": the temp directory every rank of
// a multi-rank save writes into. `nonce` is the one rank 0 published when
// the engines opened; `attempt` counts the saves of `step` this engine
// started (all ranks count alike).
std::string MultiRankTempDirName(int64_t step, absl::string_view nonce, int attempt);

// For each of `tensors`, the rank that writes it: `rank` for tensors that
// are not replicated; for replicated ones an owner chosen from their names
// and sizes alone (largest first, each to the rank with the fewest
// replicated bytes so far, ties to the lower rank), so every rank that
// declares the same replicated tensors computes the same owners.
std::vector<int> TensorOwners(std::span<const TensorView> tensors, int rank, int world_size);

// A digest of the replicated tensors' names, dtypes and shapes: equal on
// every rank that declares the same ones.
uint64_t ReplicatedFingerprint(std::span<const TensorView> tensors);

}  // namespace ckpt::internal

#endif  // CKPT_DISTRIBUTED_RANK_LAYOUT_H_
