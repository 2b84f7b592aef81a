#include "engine/reference_state.h"

#include "absl/container/flat_hash_set.h"

namespace ckpt::internal {

char* ReferenceState::Find(const std::string& name, DType dtype,
                           const std::vector<int64_t>& shape) {
  auto it = entries_.find(name);
  if (it == entries_.end() || it->second.dtype != dtype || it->second.shape != shape) return nullptr;
  return static_cast<char*>(it->second.data.data());
}

char* ReferenceState::FindOrCreate(const std::string& name, DType dtype,
                                   const std::vector<int64_t>& shape, size_t bytes) {
  if (char* found = Find(name, dtype, shape)) return found;
  auto it = entries_.find(name);
  if (it != entries_.end()) {
    bytes_ -= it->second.data.size();
    entries_.erase(it);
  }
  if (bytes > max_bytes_ - std::min(bytes_, max_bytes_)) return nullptr;
  // Pre-faulted now (on the persister thread), so later deltas take no faults.
  auto data = AlignedBytes::Allocate(bytes, /*prefault=*/true);
  if (!data.ok()) return nullptr;
  bytes_ += bytes;
  Entry& e = entries_[name];
  e = Entry{dtype, shape, std::move(*data)};
  return static_cast<char*>(e.data.data());
}

void ReferenceState::Committed(int64_t step, uint64_t manifest_xxh3, bool was_delta,
                               bool differential, uint64_t file_bytes) {
  valid_ = true;
  if (!was_delta) {
    base_step_ = step;
    base_manifest_xxh3_ = manifest_xxh3;
    deltas_since_full_ = 0;
    full_bytes_ = file_bytes;
    chain_bytes_ = file_bytes;
    last_delta_bytes_ = 0;
    return;
  }
  ++deltas_since_full_;
  last_delta_bytes_ = file_bytes;
  if (differential) {
    chain_bytes_ = full_bytes_ + file_bytes;  // the base stays the full save
  } else {
    chain_bytes_ += file_bytes;
    base_step_ = step;
    base_manifest_xxh3_ = manifest_xxh3;
  }
}

void ReferenceState::Restored(int64_t base_step, uint64_t base_manifest_xxh3, int deltas_since_full,
                              uint64_t full_bytes, uint64_t chain_bytes, uint64_t last_delta_bytes) {
  valid_ = true;
  base_step_ = base_step;
  base_manifest_xxh3_ = base_manifest_xxh3;
  deltas_since_full_ = deltas_since_full;
  full_bytes_ = full_bytes;
  chain_bytes_ = chain_bytes;
  last_delta_bytes_ = last_delta_bytes;
}

uint64_t ReferenceState::PredictedRestoreBytes(bool differential) const {
  if (last_delta_bytes_ == 0) return 0;
  return (differential ? full_bytes_ : chain_bytes_) + last_delta_bytes_;
}

char* ReferenceState::Scratch(size_t bytes) {
  absl::StatusOr<char*> memory = scratch_.Get(bytes);
  return memory.ok() ? *memory : nullptr;
}

void ReferenceState::Retain(const std::vector<TensorView>& tensors) {
  absl::flat_hash_set<std::string> keep;
  for (const TensorView& t : tensors) keep.insert(t.name);
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (!keep.contains(it->first)) {
      bytes_ -= it->second.data.size();
      entries_.erase(it++);
    } else {
      ++it;
    }
  }
}

}  // namespace ckpt::internal
