// `PlanShards`: which tensor goes into which shard file, at which offset.
#ifndef CKPT_FORMAT_SHARD_PLAN_H_
#define CKPT_FORMAT_SHARD_PLAN_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ckpt/tensor.h"

namespace ckpt::internal {

struct PlannedRecord {
  size_t tensor = 0;    // index into the planned tensors
  uint64_t offset = 0;  // multiple of kRecordAlignment
  uint64_t bytes = 0;
};

struct PlannedShard {
  std::string file;                    // "<module>.<n>.shard"
  std::vector<PlannedRecord> records;  // ascending offsets
  uint64_t padded_bytes = 0;           // bytes written (a multiple of the alignment)
  uint64_t file_bytes = 0;             // final size: end of the last record
};

// Groups tensors by module (`ModuleOf`), modules in order of first
// appearance and tensors in input order within one. Modules are merged into
// one shard until it holds `min_bytes`; a shard never grows past `max_bytes`
// unless one tensor alone is larger. Every shard has at least one record.
std::vector<PlannedShard> PlanShards(std::span<const TensorView> tensors, uint64_t min_bytes,
                                     uint64_t max_bytes);

}  // namespace ckpt::internal

#endif  // CKPT_FORMAT_SHARD_PLAN_H_
