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
#include "format/names.h"  // the per-rank file names

namespace ckpt::internal {

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
