// Global tensors of a multi-rank checkpoint: the chunk records the ranks
// saved under one name (TensorPlacement::kSharded), gathered and checked to
// tile the tensor they are parts of.
#ifndef CKPT_FORMAT_GLOBAL_TENSORS_H_
#define CKPT_FORMAT_GLOBAL_TENSORS_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ckpt/reader.h"

namespace ckpt::internal {

// One rank's records, as its part manifest lists them.
struct RankRecords {
  int rank = 0;
  const std::vector<TensorInfo>* tensors = nullptr;
};

struct GlobalTensor {
  struct Piece {
    size_t part = 0;  // index into the `parts` given to GatherGlobalTensors
    const TensorInfo* record = nullptr;
  };
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  std::vector<Piece> pieces;  // by rank, then in part order
};

// Every sharded name of `parts`, in order of first appearance, with its
// chunks. kInvalidArgument naming the tensor (and ranks) unless the chunks
// of each name agree on dtype and global shape, no two overlap, together
// they cover the global tensor, and no part holds the name unsharded.
absl::StatusOr<std::vector<GlobalTensor>> GatherGlobalTensors(std::span<const RankRecords> parts);

// The entry a reader shows for `global` (TensorInfo::chunks).
TensorInfo GlobalTensorInfo(const GlobalTensor& global, std::span<const RankRecords> parts);

}  // namespace ckpt::internal

#endif  // CKPT_FORMAT_GLOBAL_TENSORS_H_
