// `CopyCoalescer`: merges the stager's small device-to-host pieces into
// large copies. A D2H copy of 64 KiB costs about as much as one of 1 MiB, so
// pieces whose source and destination both continue the copy being built
// are issued as one — but only within one device allocation: a copy that
// runs from one allocation into the next is invalid even where the two are
// adjacent in virtual memory (two `cudaMalloc` segments of torch's caching
// allocator often are), and the driver refuses it.
//
// Knows nothing of CUDA: where an allocation ends comes from a callback, so
// the merging rules are tested without a device.
#ifndef CKPT_STAGING_COPY_COALESCER_H_
#define CKPT_STAGING_COPY_COALESCER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>

#include "absl/status/statusor.h"

namespace ckpt::internal {

// One device-to-host copy.
struct DeviceCopy {
  char* dst = nullptr;
  const char* src = nullptr;
  size_t n = 0;
  int device = 0;
};

// Where the device allocation holding an address ends (one past its last
// byte). An error means "unknown": the piece is then never merged with
// what follows it.
using AllocationEndFn = std::function<absl::StatusOr<uintptr_t>(int device, const char* address)>;

// Not thread-safe.
class CopyCoalescer {
 public:
  // `max_copy_bytes`: a merged copy is cut at this size, so that the first
  // bytes of a long run land (and can be written) before the last are copied.
  CopyCoalescer(AllocationEndFn allocation_end, size_t max_copy_bytes)
      : allocation_end_(std::move(allocation_end)), max_copy_bytes_(max_copy_bytes) {}

  // Adds `piece` (REQUIRES: it lies within one allocation). Returns the
  // copy to issue now when `piece` does not continue the pending one.
  std::optional<DeviceCopy> Add(const DeviceCopy& piece);
  // Returns the pending copy, if any, and forgets it.
  std::optional<DeviceCopy> Flush();
  bool has_pending() const { return pending_.n > 0; }

 private:
  bool Continues(const DeviceCopy& piece) const;

  const AllocationEndFn allocation_end_;
  const size_t max_copy_bytes_;
  DeviceCopy pending_;
  uintptr_t pending_end_ = 0;  // where the allocation of `pending_.src` ends
};

}  // namespace ckpt::internal

#endif  // CKPT_STAGING_COPY_COALESCER_H_
