// Boxes of a tensor's elements and the contiguous runs that copy one box
// between two row-major buffers holding boxes that contain it: the
// arithmetic of reading a region of a tensor from the chunks it was saved in.
#ifndef CKPT_READ_REGION_BOX_H_
#define CKPT_READ_REGION_BOX_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

namespace ckpt::internal {

// Elements `offset[d] .. offset[d] + shape[d]` of every dimension `d`, in
// the coordinates of the whole tensor. A scalar is the box of no dimensions
// (one element).
struct Box {
  std::vector<int64_t> offset;
  std::vector<int64_t> shape;

  uint64_t elements() const;
  bool empty() const { return elements() == 0; }
  bool operator==(const Box&) const = default;
};

// The elements `a` and `b` share; nullopt if none. REQUIRES: equal ranks.
std::optional<Box> Intersect(const Box& a, const Box& b);

// True if `inner` (inside `outer`) is one contiguous range of `outer`'s
// row-major layout.
bool IsContiguousIn(const Box& inner, const Box& outer);

// Calls `run(from, to, elements)` for each contiguous run of `box`'s
// elements, in row-major order: `from` is the run's first element as an
// index into a row-major buffer of `src`, `to` into one of `dst`.
// REQUIRES: `box` lies inside both `src` and `dst`.
void ForEachRun(const Box& box, const Box& src, const Box& dst,
                const std::function<void(uint64_t from, uint64_t to, uint64_t elements)>& run);

}  // namespace ckpt::internal

#endif  // CKPT_READ_REGION_BOX_H_
