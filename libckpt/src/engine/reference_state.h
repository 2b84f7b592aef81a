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

  // After a commit: the references now match `step`.
  void Committed(int64_t step, uint64_t manifest_xxh3, bool was_delta);
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
};

}  // namespace ckpt::internal

#endif  // CKPT_ENGINE_REFERENCE_STATE_H_
