// Encoding one tensor as a delta against its reference value R (what a
// restore of the previous checkpoint yields), and applying such a delta;
// ("planes", a full record of byte-plane blocks, shares the block coder:
// plane_codec.h).
//
// Encodings:
//   "sparse"      lossless: the elements whose bits changed — element count,
//                 gap-coded indices (LEB128 varints), then the new values;
//                 one zstd frame.
//   "xor"         lossless: a tag byte then X xor R, byte for byte, as one
//                 zstd frame declaring its content size.
//   "xor_planes"  lossless: X xor R as byte-plane blocks (plane_codec.h):
//                 the stable sign/exponent bytes of a dense change apart
//                 from its noisy low mantissa bytes, each plane zstd'd.
//   "topk"        lossy: the layout of "sparse", holding only the k largest
//                 |X - R| (non-finite changes always kept).
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
#include "util/worker_pool.h"

namespace ckpt::internal {

// Part of a tensor's new value X, in order; pieces hold whole elements.
struct Piece {
  const char* data = nullptr;
  size_t bytes = 0;
};

struct DeltaRecord {
  RecordEncoding encoding = RecordEncoding::kXor;  // kSparse, kXor, kXorPlanes or kTopK
  std::vector<char> bytes;  // the stored (compressed) payload
  uint64_t changed = 0;     // elements stored (sparse/topk) or changed (xor)
  double error_bound = 0;   // max |restored - X| (0 unless topk dropped some)
};

// Lossless delta of X (`x`, `n` bytes in total) against `r` (`n` bytes);
// afterwards r == X. The encoding is picked by actual encoded size, trying
// only the candidates that can win. With c of the N elements changed:
//   c <= N/32        sparse (a change costs its value and an index);
//   c >  N/3         dense: xor_planes for 2-, 4- and 8-byte dtypes, xor for
//                    1-byte ones (one plane: planes would only add framing);
//   in between       sparse, xor and (2/4/8-byte dtypes) xor_planes are all
//                    encoded and the smallest kept: a partly changed tensor
//                    is often smallest as plain xor, which codes each changed
//                    position once where planes code it once per plane.
// The caller still stores the record raw when the delta is not smaller than
// the tensor. xor_planes blocks (kPlaneBlockBytes each) are encoded in
// parallel on `pool` when given (REQUIRES: not called from `pool`'s work).
// Scratch is per thread and reused; the result's bytes are the only
// allocation that grows with the tensor (see RecycleDeltaBytes).
absl::StatusOr<DeltaRecord> EncodeExactDelta(std::span<const Piece> x, char* r, size_t n,
                                             DType dtype, int zstd_level,
                                             WorkerPool* pool = nullptr);

// Hands a record's bytes back once stored: this thread's next encode
// (EncodeExactDelta, EncodeXorDelta) writes its output
// into them instead of into fresh memory (first touch costs ~5 s/GB on
// this VM, more than encoding). One buffer is kept per thread, the largest
// handed back; losing candidates are recycled by the encoder itself.
void RecycleDeltaBytes(std::vector<char>&& bytes);

// A plain "xor" payload of X against r (r unchanged), whatever the dtype:
// for comparisons (bench/delta_bench.cc, tests); EncodeExactDelta chooses.
absl::StatusOr<std::vector<char>> EncodeXorDelta(std::span<const Piece> x, const char* r, size_t n,
                                                 int zstd_level);

// Top-k delta: keeps the ceil(ratio * numel) largest |X - R| (all changes
// when there are no more than that). Afterwards r holds R with the kept
// elements replaced by X's. Floating dtypes only; others are encoded exactly.
absl::StatusOr<DeltaRecord> EncodeTopKDelta(std::span<const Piece> x, char* r, size_t n,
                                            DType dtype, double ratio, int zstd_level);

// Applies a stored delta (sparse, xor, xor_planes or topk) to `dst` (`n`
// bytes, holding R). kDataLoss on any malformed payload or another
// encoding; nothing is ever written outside dst[0, n). A sparse/topk
// payload and the block structure of xor_planes are checked whole before
// anything is written; an xor stream, or corrupt zstd data inside an
// xor_planes block, may be found only after part of dst was updated (the
// record's checksum fails anyway). Decompresses through per-thread scratch
// (no allocation per call that grows with n). xor_planes blocks are decoded
// in parallel on `pool` when given.
absl::Status ApplyDelta(RecordEncoding encoding, const char* payload, size_t payload_bytes,
                        char* dst, size_t n, DType dtype, WorkerPool* pool = nullptr);

}  // namespace ckpt::internal

#endif  // CKPT_DELTA_DELTA_CODEC_H_
