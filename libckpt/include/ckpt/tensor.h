// ckpt/tensor.h: what a save reads from and a restore writes into.
#ifndef CKPT_TENSOR_H_
#define CKPT_TENSOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ckpt/distributed.h"
#include "ckpt/dtype.h"

namespace ckpt {

// `TensorView` names caller-owned, contiguous bytes of one tensor. A save
// reads `nbytes` bytes at `data`; it never writes them and keeps no pointer
// after the call that consumes the view returns (for `Engine::Save`) or after
// the save's staging completes (for the asynchronous API).
//
// `nbytes` must equal the product of `shape` times `DTypeSize(dtype)`; a
// scalar has an empty `shape` (one element). `name` is any non-empty valid
// UTF-8 string without NUL; it never shapes a file path.
struct TensorView {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t nbytes = 0;
  // Where `data` lives. For `kCuda`, `data` is device memory on
  // `device_index`, and `stream` is the caller's cudaStream_t (nullptr: the
  // legacy default stream): the device-to-host copy runs on a side stream
  // that first waits for the work already queued on `stream` (never for the
  // whole device). The caller may overwrite the tensor once staging is done
  // (after `SaveAsync` returns in eager mode, after `WaitStaged` in lazy
  // mode), as for host tensors. `SaveAsync` records the ordering event on
  // `stream` on the calling thread, so `cudaStreamPerThread` means the
  // caller's per-thread stream in both modes (a lazy save's copies are queued
  // later, from the staging thread, after that event).
  enum class Device : uint8_t { kCpu, kCuda };
  Device device = Device::kCpu;
  int device_index = 0;
  void* stream = nullptr;
  // Multi-rank saves (ckpt/distributed.h): replicated, rank-local, or the
  // rank's own. Ignored by single-process engines.
  TensorPlacement placement = TensorPlacement::kDefault;
  // For `kSharded` (ignored otherwise): the shape of the global tensor this
  // view is a chunk of, and where the chunk starts in it — one entry per
  // dimension each, `shape` being the chunk's own.
  std::vector<int64_t> global_shape;
  std::vector<int64_t> global_offset;
};

// `NumElements` is the product of `shape` (1 for a scalar), or
// `kInvalidArgument` if a dimension is negative or the product overflows.
absl::StatusOr<uint64_t> NumElements(const std::vector<int64_t>& shape);

// `TensorBytes` is the size in bytes of a `dtype` tensor of `shape`, or
// `kInvalidArgument` if a dimension is negative or the size overflows.
absl::StatusOr<uint64_t> TensorBytes(DType dtype, const std::vector<int64_t>& shape);

// `AlignedBytes` is an owned, 4 KiB-aligned host buffer (usable for O_DIRECT
// I/O). Move-only.
class AlignedBytes {
 public:
  AlignedBytes() = default;
  // Allocates `size` bytes (rounded up to 4 KiB internally). With
  // `prefault`, every page is touched once so later use takes no faults.
  static absl::StatusOr<AlignedBytes> Allocate(size_t size, bool prefault);

  AlignedBytes(AlignedBytes&& other) noexcept;
  AlignedBytes& operator=(AlignedBytes&& other) noexcept;
  AlignedBytes(const AlignedBytes&) = delete;
  AlignedBytes& operator=(const AlignedBytes&) = delete;
  ~AlignedBytes();

  void* data() { return data_; }
  const void* data() const { return data_; }
  size_t size() const { return size_; }          // the requested size
  size_t capacity() const { return capacity_; }  // `size()` rounded up to 4 KiB

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
  size_t capacity_ = 0;
};

// `Tensor` is a tensor read back from a checkpoint, owning its bytes.
struct Tensor {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  AlignedBytes bytes;

  const void* data() const { return bytes.data(); }
  size_t nbytes() const { return bytes.size(); }
};

}  // namespace ckpt

#endif  // CKPT_TENSOR_H_
