// Rounding offsets and sizes to a multiple of an alignment (the record
// alignment, the O_DIRECT block size).
#ifndef CKPT_UTIL_ALIGN_H_
#define CKPT_UTIL_ALIGN_H_

#include <cstdint>

namespace ckpt::internal {

// `n` rounded up to a multiple of `alignment` (> 0).
constexpr uint64_t AlignUp(uint64_t n, uint64_t alignment) {
  return (n + alignment - 1) / alignment * alignment;
}
// `n` rounded down to a multiple of `alignment` (> 0).
constexpr uint64_t AlignDown(uint64_t n, uint64_t alignment) { return n / alignment * alignment; }

}  // namespace ckpt::internal

#endif  // CKPT_UTIL_ALIGN_H_
