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

void ReferenceState::Committed(int64_t step, uint64_t manifest_xxh3, bool was_delta) {
  valid_ = true;
  base_step_ = step;
  base_manifest_xxh3_ = manifest_xxh3;
  deltas_since_full_ = was_delta ? deltas_since_full_ + 1 : 0;
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
