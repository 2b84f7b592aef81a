#include "codec/record_codecs.h"

#include <zstd.h>

#include <cstring>
#include <iterator>
#include <string>

#include "absl/strings/str_cat.h"
#include "codec/zstd_context.h"
#include "delta/delta_codec.h"
#include "delta/plane_codec.h"

namespace ckpt::internal {
namespace {

absl::Status DecodeRaw(const char* stored, size_t stored_bytes, char* dst, size_t n, DType dtype,
                       WorkerPool* pool) {
  if (stored_bytes != n) {
    return absl::DataLossError(absl::StrCat("raw record of ", stored_bytes, " bytes for ", n));
  }
  if (n != 0) std::memcpy(dst, stored, n);
  return absl::OkStatus();
}

// One or more zstd frames (the engine writes one per staged chunk) that
// decompress to exactly n bytes.
absl::Status DecodeZstd(const char* stored, size_t stored_bytes, char* dst, size_t n, DType dtype,
                        WorkerPool* pool) {
  ZSTD_DCtx* dctx = ThreadZstdDCtx();
  if (dctx == nullptr) return absl::ResourceExhaustedError("ZSTD_createDCtx failed");
  ZSTD_DCtx_reset(dctx, ZSTD_reset_session_only);
  ZSTD_inBuffer in{stored, stored_bytes, 0};
  size_t produced = 0;
  size_t last = 0;
  while (in.pos < in.size) {
    if (produced == n) {
      return absl::DataLossError(absl::StrCat("decompresses to more than ", n, " bytes"));
    }
    ZSTD_outBuffer out{dst + produced, n - produced, 0};
    last = ZSTD_decompressStream(dctx, &out, &in);
    if (ZSTD_isError(last)) {
      return absl::DataLossError(absl::StrCat("corrupt zstd data: ", ZSTD_getErrorName(last)));
    }
    produced += out.pos;
  }
  if (last != 0 || produced != n) {
    return absl::DataLossError(absl::StrCat("zstd data ends after ", produced, " of ", n, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status DecodePlanes(const char* stored, size_t stored_bytes, char* dst, size_t n,
                          DType dtype, WorkerPool* pool) {
  return DecodePlaneBlocks(stored, stored_bytes, DTypeScalarSize(dtype), dst, n, /*xor_into=*/false, pool);
}

template <RecordEncoding kEncoding>
absl::Status Apply(const char* stored, size_t stored_bytes, char* dst, size_t n, DType dtype,
                   WorkerPool* pool) {
  return ApplyDelta(kEncoding, stored, stored_bytes, dst, n, dtype, pool);
}

absl::Status DecodeUnknown(const char*, size_t, char*, size_t, DType, WorkerPool*) {
  return absl::DataLossError("unknown record encoding");
}

uint64_t NoMinimum(uint64_t) { return 0; }
uint64_t AllBytes(uint64_t raw_bytes) { return raw_bytes; }
// zstd cannot expand a byte more than this (an RLE block: 4 bytes for 128
// KiB), so a small record claiming a huge tensor is refused.
uint64_t ZstdMinimum(uint64_t raw_bytes) { return raw_bytes / 32768; }
uint64_t PlanesMinimum(uint64_t raw_bytes) { return MinPlanePayloadBytes(raw_bytes); }

// In the order of `RecordEncoding`.
constexpr RecordCodec kCodecs[] = {
    {RecordEncoding::kRaw, "raw", false, false, AllBytes, DecodeRaw, std::nullopt},
    {RecordEncoding::kZstd, "zstd", false, true, ZstdMinimum, DecodeZstd, CompressionCodec::kZstd},
    {RecordEncoding::kSparse, "sparse", true, false, NoMinimum, Apply<RecordEncoding::kSparse>,
     std::nullopt},
    {RecordEncoding::kXor, "xor", true, false, NoMinimum, Apply<RecordEncoding::kXor>, std::nullopt},
    {RecordEncoding::kTopK, "topk", true, false, NoMinimum, Apply<RecordEncoding::kTopK>, std::nullopt},
    {RecordEncoding::kPlanes, "planes", false, true, PlanesMinimum, DecodePlanes,
     CompressionCodec::kPlanes},
    {RecordEncoding::kXorPlanes, "xor_planes", true, false, PlanesMinimum,
     Apply<RecordEncoding::kXorPlanes>, std::nullopt},
};

constexpr RecordCodec kUnknown = {RecordEncoding::kRaw, "unknown", false, false, NoMinimum,
                                  DecodeUnknown, std::nullopt};

constexpr bool InEnumOrder() {
  for (size_t i = 0; i < std::size(kCodecs); ++i) {
    if (static_cast<size_t>(kCodecs[i].encoding) != i) return false;
  }
  return true;
}
static_assert(InEnumOrder(), "kCodecs must list the encodings in the order of RecordEncoding");

}  // namespace

const RecordCodec& CodecOf(RecordEncoding encoding) {
  // No default: an encoding added to the enum without an entry here fails to
  // compile (-Werror=switch).
  switch (encoding) {
    case RecordEncoding::kRaw:
    case RecordEncoding::kZstd:
    case RecordEncoding::kSparse:
    case RecordEncoding::kXor:
    case RecordEncoding::kTopK:
    case RecordEncoding::kPlanes:
    case RecordEncoding::kXorPlanes: {
      const size_t i = static_cast<size_t>(encoding);
      // (An enumerator named above without its entry in kCodecs.)
      return i < std::size(kCodecs) ? kCodecs[i] : kUnknown;
    }
  }
  return kUnknown;
}

absl::Span<const RecordCodec> AllRecordCodecs() { return kCodecs; }

}  // namespace ckpt::internal
