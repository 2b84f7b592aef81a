// `ReferenceState`: for delta checkpoints, what a restore of the engine's
// last committed checkpoint yields, tensor by tensor (one host copy of the
// state, bounded by `DeltaOptions::max_reference_bytes`). Owned and used by
// the persister thread only.
#ifndef CKPT_ENGINE_REFERENCE_STATE_H_
#define CKPT_ENGINE_REFERENCE_STATE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "ckpt/options.h"
#include "ckpt/tensor.h"
#include "util/scratch_bytes.h"

namespace ckpt::internal {

class ReferenceState {
 public:
  explicit ReferenceState(size_t max_bytes) : max_bytes_(max_bytes) {}

  // The reference of `name` if it has this dtype and shape; else nullptr.
  char* Find(const std::string& name, DType dtype, const std::vector<int64_t>& shape);
  // As `Find`, creating (allocated, not yet meaningful) storage if the
  // budget allows; nullptr otherwise. Drops a same-named entry of another
  // dtype or shape.
  char* FindOrCreate(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                     size_t bytes);

  // Whether the references match the last committed checkpoint of this
  // engine, `base_step`, whose manifest checksum is `base_manifest_xxh3`.
  bool valid() const { return valid_; }
  int64_t base_step() const { return base_step_; }
  uint64_t base_manifest_xxh3() const { return base_manifest_xxh3_; }
  int deltas_since_full() const { return deltas_since_full_; }

  // After a commit of `step` (`file_bytes` stored): the references now match
  // it, or, for a differential delta, still match the full save they were
  // taken against (which stays the base).
  void Committed(int64_t step, uint64_t manifest_xxh3, bool was_delta, bool differential,
                 uint64_t file_bytes);
  // As after committing the checkpoints of a chain read back at `Open`: the
  // references hold `base_step`'s values; `deltas_since_full` deltas were
  // taken since the full save, whose stored bytes were `full_bytes`; a
  // restore of the newest reads `chain_bytes`, of which `last_delta_bytes`
  // its newest delta (0: none).
  void Restored(int64_t base_step, uint64_t base_manifest_xxh3, int deltas_since_full,
                uint64_t full_bytes, uint64_t chain_bytes, uint64_t last_delta_bytes);
  // What a restore of the next delta would read: the full save plus the
  // deltas applied (chained: every one since the full; differential: that
  // one), the next predicted by the last one's size. 0 when no delta was
  // taken since the full save (nothing to predict from).
  uint64_t PredictedRestoreBytes(bool differential) const;
  uint64_t full_bytes() const { return full_bytes_; }
  // Memory of at least `bytes` for encoding against a copy of a reference
  // (differential deltas leave the reference as it is); grown, pre-faulted,
  // and reused.
  char* Scratch(size_t bytes);
  // After a failed save (references may be half updated): the next save is full.
  void Invalidate() { valid_ = false; }
  // Keeps only the named tensors (a save that no longer has a tensor).
  void Retain(const std::vector<TensorView>& tensors);
  size_t bytes() const { return bytes_; }

 private:
  struct Entry {
    DType dtype;
    std::vector<int64_t> shape;
    AlignedBytes data;
  };
  const size_t max_bytes_;
  size_t bytes_ = 0;
  absl::flat_hash_map<std::string, Entry> entries_;
  bool valid_ = false;
  int64_t base_step_ = -1;
  uint64_t base_manifest_xxh3_ = 0;
  int deltas_since_full_ = 0;
  uint64_t full_bytes_ = 0;        // stored bytes of the last full save
  uint64_t chain_bytes_ = 0;       // what a restore of the last checkpoint reads
  uint64_t last_delta_bytes_ = 0;  // stored bytes of the last delta (0: none since the full)
  ScratchBytes scratch_;
};

}  // namespace ckpt::internal

#endif  // CKPT_ENGINE_REFERENCE_STATE_H_
