#include "read/region_box.h"

#include <algorithm>

namespace ckpt::internal {

uint64_t Box::elements() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

std::optional<Box> Intersect(const Box& a, const Box& b) {
  Box out;
  for (size_t d = 0; d < a.shape.size(); ++d) {
    const int64_t from = std::max(a.offset[d], b.offset[d]);
    const int64_t to = std::min(a.offset[d] + a.shape[d], b.offset[d] + b.shape[d]);
    if (to <= from) return std::nullopt;
    out.offset.push_back(from);
    out.shape.push_back(to - from);
  }
  return out;
}

bool IsContiguousIn(const Box& inner, const Box& outer) {
  // Full in every dimension after some `k`, a single index in every one
  // before it.
  size_t d = inner.shape.size();
  while (d > 0 && inner.shape[d - 1] == outer.shape[d - 1]) --d;
  if (d == 0) return true;
  for (size_t e = 0; e + 1 < d; ++e) {
    if (inner.shape[e] != 1) return false;
  }
  return true;
}

namespace {

// Row-major strides (in elements) of a buffer holding `box`.
std::vector<uint64_t> Strides(const Box& box) {
  std::vector<uint64_t> strides(box.shape.size(), 1);
  for (size_t d = box.shape.size(); d-- > 1;) {
    strides[d - 1] = strides[d] * static_cast<uint64_t>(box.shape[d]);
  }
  return strides;
}

}  // namespace

void ForEachRun(const Box& box, const Box& src, const Box& dst,
                const std::function<void(uint64_t, uint64_t, uint64_t)>& run) {
  const size_t rank = box.shape.size();
  if (box.empty()) return;
  if (rank == 0) {
    run(0, 0, 1);
    return;
  }
  // The innermost dimensions that all three boxes span fully merge into
  // one run with the next one out.
  size_t outer = rank - 1;  // dimensions [0, outer) are iterated
  uint64_t run_elements = static_cast<uint64_t>(box.shape[outer]);
  while (outer > 0 && box.shape[outer] == src.shape[outer] && box.shape[outer] == dst.shape[outer]) {
    --outer;
    run_elements *= static_cast<uint64_t>(box.shape[outer]);
  }
  const std::vector<uint64_t> src_strides = Strides(src);
  const std::vector<uint64_t> dst_strides = Strides(dst);
  auto start = [&](const Box& in, const std::vector<uint64_t>& strides, const std::vector<int64_t>& at) {
    uint64_t index = 0;
    for (size_t d = 0; d < rank; ++d) index += static_cast<uint64_t>(at[d] - in.offset[d]) * strides[d];
    return index;
  };
  std::vector<int64_t> at = box.offset;  // the run's first element; dims >= outer stay at the box's start
  while (true) {
    run(start(src, src_strides, at), start(dst, dst_strides, at), run_elements);
    size_t d = outer;
    while (d > 0) {
      --d;
      if (++at[d] < box.offset[d] + box.shape[d]) break;
      at[d] = box.offset[d];
      if (d == 0) return;
    }
    if (outer == 0) return;
  }
}

}  // namespace ckpt::internal
