// Encoding one tensor as a delta against its reference value R (what a
// restore of the previous checkpoint yields), and applying such a delta.
//
// Encodings (payloads are zstd-compressed):
//   "sparse"  lossless: the elements whose bits changed — element count,
//             gap-coded indices (LEB128 varints), then the new values.
//   "xor"     lossless: X xor R, byte for byte (wins when most elements
//             changed but few bits did).
//   "topk"    lossy: the layout of "sparse", holding only the k largest
//             |X - R| (non-finite changes always kept).
// Encoders update R in place to exactly what a restore will produce, so the
// error after any delta is bounded by that one delta's dropped changes and
// never accumulates along a chain.
#ifndef CKPT_DELTA_DELTA_CODEC_H_
#define CKPT_DELTA_DELTA_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ckpt/dtype.h"
#include "ckpt/kinds.h"

namespace ckpt::internal {

// Part of a tensor's new value X, in order; pieces hold whole elements.
struct Piece {
  const char* data = nullptr;
  size_t bytes = 0;
};

struct DeltaRecord {
  RecordEncoding encoding = RecordEncoding::kXor;  // kSparse, kXor or kTopK
  std::vector<char> bytes;  // the stored (compressed) payload
  uint64_t changed = 0;     // elements stored (sparse/topk) or changed (xor)
  double error_bound = 0;   // max |restored - X| (0 unless topk dropped some)
};

// Lossless delta of X (`x`, `n` bytes in total) against `r` (`n` bytes);
// afterwards r == X. Picks sparse or xor by the fraction of changed elements.
absl::StatusOr<DeltaRecord> EncodeExactDelta(std::span<const Piece> x, char* r, size_t n,
                                             DType dtype, int zstd_level);

// Top-k delta: keeps the ceil(ratio * numel) largest |X - R| (all changes
// when there are no more than that). Afterwards r holds R with the kept
// elements replaced by X's. Floating dtypes only; others are encoded exactly.
absl::StatusOr<DeltaRecord> EncodeTopKDelta(std::span<const Piece> x, char* r, size_t n,
                                            DType dtype, double ratio, int zstd_level);

// Applies a stored delta to `dst` (`n` bytes, holding R). kDataLoss on any
// malformed payload (bounds checked before writing).
absl::Status ApplyDelta(RecordEncoding encoding, const char* payload, size_t payload_bytes,
                        char* dst, size_t n, DType dtype);

}  // namespace ckpt::internal

#endif  // CKPT_DELTA_DELTA_CODEC_H_
