#include "testing/codec_testing.h"

#include <algorithm>
#include <cstring>

#include "codec/record_codecs.h"
#include "delta/plane_codec.h"

namespace ckpt::internal {

absl::StatusOr<std::vector<char>> EncodePlanesRecord(std::span<const Piece> x, size_t n, DType dtype,
                                                     int zstd_level, WorkerPool* pool) {
  std::vector<char> bytes;
  bytes.reserve(n);
  for (const Piece& p : x) bytes.insert(bytes.end(), p.data, p.data + p.bytes);
  if (bytes.size() != n) return absl::InvalidArgumentError("pieces do not add up to the record");
  const size_t blocks = (n + kPlaneBlockBytes - 1) / kPlaneBlockBytes;
  std::vector<std::vector<char>> encoded(blocks);
  std::vector<absl::Status> status(blocks);
  auto encode = [&](size_t b) {
    const size_t offset = b * kPlaneBlockBytes;
    status[b] = AppendPlaneBlock(bytes.data() + offset, std::min(kPlaneBlockBytes, n - offset),
                                 DTypeScalarSize(dtype), zstd_level, /*store_raw=*/false, &encoded[b]);
  };
  if (pool != nullptr) {
    pool->ParallelFor(blocks, encode);
  } else {
    for (size_t b = 0; b < blocks; ++b) encode(b);
  }
  std::vector<char> out;
  for (size_t b = 0; b < blocks; ++b) {
    if (!status[b].ok()) return status[b];
    out.insert(out.end(), encoded[b].begin(), encoded[b].end());
  }
  return out;
}

absl::Status DecodePlanesRecord(const char* payload, size_t payload_bytes, char* dst, size_t n,
                                DType dtype, WorkerPool* pool) {
  return CodecOf(RecordEncoding::kPlanes).decode(payload, payload_bytes, dst, n, dtype, pool);
}

}  // namespace ckpt::internal
