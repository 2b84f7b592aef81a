// Fuzzes ApplyDelta, which decodes a delta record (zstd-compressed sparse,
// xor or top-k payloads, and xor_planes byte-plane blocks) onto a base
// value, and the codec table's decode of a full "planes" record. Input: a byte
// choosing the encoding, a byte choosing the dtype, two bytes of element
// count, then the payload. The first byte % 3 picks sparse, xor or topk as
// it always has (the seeds of fuzz_seeds rely on it); bit 7 set instead
// picks xor_planes (bit 6 clear) or planes (bit 6 set). The base is a fixed
// pattern; any payload must be refused or applied within the `n` bytes of
// the destination (ASan checks the rest), and with one thread or a pool
// alike.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "ckpt/dtype.h"
#include "codec/record_codecs.h"
#include "delta/delta_codec.h"
#include "util/worker_pool.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  using ckpt::RecordEncoding;
  static constexpr RecordEncoding kEncodings[] = {RecordEncoding::kSparse, RecordEncoding::kXor,
                                                  RecordEncoding::kTopK};
  const bool planes = (data[0] & 0x80) != 0;
  const bool full = planes && (data[0] & 0x40) != 0;
  const RecordEncoding encoding = planes ? RecordEncoding::kXorPlanes : kEncodings[data[0] % 3];
  const auto dtype = static_cast<ckpt::DType>(data[1] % ckpt::kNumDTypes);
  const size_t elements = (size_t{data[2]} << 8 | data[3]) % 4096;
  const size_t n = elements * ckpt::DTypeSize(dtype);
  std::vector<char> dst(n);
  for (size_t i = 0; i < n; ++i) dst[i] = static_cast<char>(i * 131);
  const char* payload = reinterpret_cast<const char*>(data + 4);
  static ckpt::internal::WorkerPool pool(2, "fuzz", 0);
  ckpt::internal::WorkerPool* on = (data[1] & 0x80) != 0 ? &pool : nullptr;
  if (full) {
    (void)ckpt::internal::CodecOf(RecordEncoding::kPlanes).decode(payload, size - 4, dst.data(), n, dtype, on);
  } else {
    (void)ckpt::internal::ApplyDelta(encoding, payload, size - 4, dst.data(), n, dtype, on);
  }
  return 0;
}
