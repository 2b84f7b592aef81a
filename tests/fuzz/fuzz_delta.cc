// Fuzzes ApplyDelta, which decodes a delta record (zstd-compressed sparse,
// xor or top-k payloads) onto a base value. Input: a byte choosing the
// encoding, a byte choosing the dtype, two bytes of element count, then the
// payload. The base is a fixed pattern; any payload must be refused or
// applied within the `n` bytes of the destination (ASan checks the rest).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "ckpt/dtype.h"
#include "delta/delta_codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  using ckpt::RecordEncoding;
  static constexpr RecordEncoding kEncodings[] = {RecordEncoding::kSparse, RecordEncoding::kXor,
                                                  RecordEncoding::kTopK};
  const RecordEncoding encoding = kEncodings[data[0] % 3];
  const auto dtype = static_cast<ckpt::DType>(data[1] % ckpt::kNumDTypes);
  const size_t elements = (size_t{data[2]} << 8 | data[3]) % 4096;
  const size_t n = elements * ckpt::DTypeSize(dtype);
  std::vector<char> dst(n);
  for (size_t i = 0; i < n; ++i) dst[i] = static_cast<char>(i * 131);
  (void)ckpt::internal::ApplyDelta(encoding, reinterpret_cast<const char*>(data + 4), size - 4,
                                   dst.data(), n, dtype);
  return 0;
}
