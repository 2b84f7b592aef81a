// `ScratchBytes`: reusable aligned memory that grows to the largest size
// asked for, allocated and pre-faulted when it grows (first touch is the
// costly part on these VMs), never shrunk.
#ifndef CKPT_UTIL_SCRATCH_BYTES_H_
#define CKPT_UTIL_SCRATCH_BYTES_H_

#include <cstddef>

#include "absl/status/statusor.h"
#include "ckpt/tensor.h"

namespace ckpt::internal {

class ScratchBytes {
 public:
  // At least `bytes` of memory, valid until the next call that grows it.
  absl::StatusOr<char*> Get(size_t bytes) {
    if (memory_.size() < bytes) {
      memory_ = AlignedBytes();  // the old memory goes first
      absl::StatusOr<AlignedBytes> grown = AlignedBytes::Allocate(bytes, /*prefault=*/true);
      if (!grown.ok()) return grown.status();
      memory_ = std::move(*grown);
    }
    return static_cast<char*>(memory_.data());
  }

 private:
  AlignedBytes memory_;
};

}  // namespace ckpt::internal

#endif  // CKPT_UTIL_SCRATCH_BYTES_H_
