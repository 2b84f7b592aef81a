#include "staging/copy_coalescer.h"

#include <utility>

namespace ckpt::internal {

std::optional<DeviceCopy> CopyCoalescer::Add(const DeviceCopy& piece) {
  if (piece.n == 0) return std::nullopt;
  if (Continues(piece)) {
    pending_.n += piece.n;
    return std::nullopt;
  }
  std::optional<DeviceCopy> ready = Flush();
  pending_ = piece;
  // The piece's own end when the allocation is unknown: nothing merges.
  const uintptr_t piece_end = reinterpret_cast<uintptr_t>(piece.src) + piece.n;
  absl::StatusOr<uintptr_t> end = allocation_end_(piece.device, piece.src);
  pending_end_ = end.ok() && *end >= piece_end ? *end : piece_end;
  return ready;
}

std::optional<DeviceCopy> CopyCoalescer::Flush() {
  if (pending_.n == 0) return std::nullopt;
  return std::exchange(pending_, DeviceCopy{});
}

bool CopyCoalescer::Continues(const DeviceCopy& piece) const {
  return pending_.n > 0 && pending_.device == piece.device && pending_.dst + pending_.n == piece.dst &&
         pending_.src + pending_.n == piece.src && pending_.n + piece.n <= max_copy_bytes_ &&
         reinterpret_cast<uintptr_t>(piece.src) + piece.n <= pending_end_;
}

}  // namespace ckpt::internal
