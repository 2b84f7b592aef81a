// Byte-plane ("planes") blocks: the bytes of a run of elements regrouped by
// significance before entropy coding, as the best lossless float codecs do.
// An element of E bytes (1, 2, 4 or 8; little-endian) contributes its byte k
// to plane k, so plane E-1 holds every sign and high exponent byte (which
// vary little within a tensor, or between two steps of one), and plane 0 the
// noisy low mantissa bytes. Each plane is zstd-compressed on its own, or
// stored as it is where zstd does not shrink it.
//
// A payload is a sequence of blocks, each self-describing (docs/format.md,
// "planes"): a block is encoded from one run of whole elements, either as
// planes or verbatim (`store_raw`: what the adaptive rule chooses for bytes
// whose encoding does not pay). Blocks decode independently, so a record's
// blocks are encoded and decoded in parallel.
//
// Used by two record encodings: "planes" (a full record: the blocks hold the
// tensor's bytes) and "xor_planes" (a delta: the blocks hold X xor R).
#ifndef CKPT_DELTA_PLANE_CODEC_H_
#define CKPT_DELTA_PLANE_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "util/worker_pool.h"

namespace ckpt::internal {

// Records are cut into blocks of at most this many bytes by the encoders:
// the unit of parallel work and of a reader's scratch memory.
inline constexpr size_t kPlaneBlockBytes = size_t{1} << 20;

// The fewest bytes a block can take: its header, one plane descriptor and
// one constant byte (a 1-byte element's only plane).
inline constexpr size_t kMinPlaneBlockBytes = 7 + 5 + 1;

// The fewest stored bytes a payload covering `n` bytes can take: one
// smallest block per kPlaneBlockBytes (what a manifest's stored_bytes is
// checked against before a reader allocates `n` bytes for it).
constexpr uint64_t MinPlanePayloadBytes(uint64_t n) {
  return kMinPlaneBlockBytes * ((n + kPlaneBlockBytes - 1) / kPlaneBlockBytes);
}

// The most bytes `AppendPlaneBlock` appends for `n` input bytes.
size_t PlaneBlockBound(size_t n, size_t elem_bytes);

// Appends one block holding data[0, n) to `out` (with `xor_with`, the block
// holds data[i] ^ xor_with[i] instead: an xor_planes delta's block, without
// an intermediate buffer). REQUIRES: n is a multiple of `elem_bytes` (1, 2,
// 4 or 8) and at most kPlaneBlockBytes; else kInvalidArgument. n == 0
// appends nothing. `level`: zstd level of the planes (negative levels are
// zstd's fast levels). A plane zstd does not shrink is stored verbatim, a
// plane of one repeated byte as that byte; a block none of whose planes
// shrink is written raw, as is every block with `store_raw`. Appends at most
// PlaneBlockBound(n, elem_bytes) bytes. Thread-safe (per-thread zstd
// contexts and scratch).
absl::Status AppendPlaneBlock(const char* data, size_t n, size_t elem_bytes, int level,
                              bool store_raw, std::vector<char>* out,
                              const char* xor_with = nullptr);

// Decodes `payload` (consecutive blocks) into dst[0, n): writes the decoded
// bytes or, with `xor_into`, XORs them into what dst holds. The blocks must
// cover exactly n bytes. kDataLoss naming what is malformed (nothing is
// written past n). Every block header is checked before anything is
// written, so a payload of the wrong structure leaves dst as it was; corrupt
// zstd data in one block may leave other blocks applied. With `pool`, blocks
// are decoded in parallel (REQUIRES: not called from inside `pool`'s work).
absl::Status DecodePlaneBlocks(const char* payload, size_t bytes, size_t elem_bytes, char* dst,
                               size_t n, bool xor_into, WorkerPool* pool = nullptr);

}  // namespace ckpt::internal

#endif  // CKPT_DELTA_PLANE_CODEC_H_
