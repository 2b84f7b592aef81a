#include "ckpt/tensor.h"

#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "ckpt/file_system.h"

namespace ckpt {

absl::StatusOr<uint64_t> NumElements(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t dim : shape) {
    if (dim < 0) return absl::InvalidArgumentError(absl::StrCat("negative dimension ", dim));
    if (dim != 0 && n > UINT64_MAX / static_cast<uint64_t>(dim)) {
      return absl::InvalidArgumentError("shape's element count overflows 64 bits");
    }
    n *= static_cast<uint64_t>(dim);
  }
  return n;
}

absl::StatusOr<uint64_t> TensorBytes(DType dtype, const std::vector<int64_t>& shape) {
  auto numel = NumElements(shape);
  if (!numel.ok()) return numel.status();
  const uint64_t elem = DTypeSize(dtype);
  if (*numel != 0 && elem > UINT64_MAX / *numel) {
    return absl::InvalidArgumentError("shape's size in bytes overflows 64 bits");
  }
  return *numel * elem;
}

absl::StatusOr<AlignedBytes> AlignedBytes::Allocate(size_t size, bool prefault) {
  AlignedBytes bytes;
  bytes.size_ = size;
  bytes.capacity_ = AlignUp(size);
  if (bytes.capacity_ < size) return absl::ResourceExhaustedError("allocation size overflows");
  if (bytes.capacity_ == 0) return bytes;
  void* p = nullptr;
  if (posix_memalign(&p, kDirectIoAlignment, bytes.capacity_) != 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", bytes.capacity_, " aligned bytes"));
  }
  bytes.data_ = p;
  if (prefault) std::memset(p, 0, bytes.capacity_);
  return bytes;
}

AlignedBytes::AlignedBytes(AlignedBytes&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      capacity_(std::exchange(other.capacity_, 0)) {}

AlignedBytes& AlignedBytes::operator=(AlignedBytes&& other) noexcept {
  if (this != &other) {
    std::free(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    capacity_ = std::exchange(other.capacity_, 0);
  }
  return *this;
}

AlignedBytes::~AlignedBytes() { std::free(data_); }

}  // namespace ckpt
