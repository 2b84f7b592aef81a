#include "export/float_convert.h"

#include <cmath>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace ckpt::internal {
namespace {

uint32_t BitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float FloatOf(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t BFloat16FromFloat(float f) {
  if (std::isnan(f)) return 0x7fc0;
  const uint32_t u = BitsOf(f);
  return static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);  // to nearest even
}

float FloatFromBFloat16(uint16_t h) { return FloatOf(uint32_t{h} << 16); }

// fp32 -> IEEE fp16, to nearest even. Adding a power of two chosen by the
// input's exponent makes the float adder do the rounding: the value is first
// scaled so that anything too large becomes infinity and the smallest
// normals line up, then the sum's low bits are fp16's exponent and mantissa.
uint16_t HalfFromFloat(float f) {
  const float to_inf = FloatOf(0x77800000);   // 2^112
  const float to_zero = FloatOf(0x08800000);  // 2^-110
  float base = (std::fabs(f) * to_inf) * to_zero;
  const uint32_t w = BitsOf(f);
  const uint32_t twice = w + w;  // the sign shifted out
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = twice & 0xff000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;  // fp16 subnormals: round at 2^-24
  base = FloatOf((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = BitsOf(base);
  const uint32_t exponent = (bits >> 13) & 0x00007c00u;
  const uint32_t mantissa = bits & 0x00000fffu;
  const uint32_t nonsign = twice > 0xff000000u ? 0x7e00u : exponent + mantissa;  // NaN: quiet
  return static_cast<uint16_t>((sign >> 16) | nonsign);
}

float FloatFromHalf(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t exponent = (h >> 10) & 0x1f;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return FloatOf(sign | 0x7f800000u | (mantissa << 13));
  if (exponent != 0) return FloatOf(sign | ((exponent + 112) << 23) | (mantissa << 13));
  const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);  // subnormal, exact
  return sign ? -magnitude : magnitude;
}

// One element of `from` at `p`, exactly.
double Load(DType from, const char* p) {
  switch (from) {
    case DType::kFloat16: { uint16_t h; std::memcpy(&h, p, 2); return FloatFromHalf(h); }
    case DType::kBFloat16: { uint16_t h; std::memcpy(&h, p, 2); return FloatFromBFloat16(h); }
    case DType::kFloat32: { float f; std::memcpy(&f, p, 4); return f; }
    default: { double d; std::memcpy(&d, p, 8); return d; }
  }
}

void Store(DType to, double value, char* p) {
  if (to == DType::kFloat64) {
    std::memcpy(p, &value, 8);
    return;
  }
  const float f = static_cast<float>(value);  // (from fp64: through fp32, as c10 does)
  switch (to) {
    case DType::kFloat16: { const uint16_t h = HalfFromFloat(f); std::memcpy(p, &h, 2); return; }
    case DType::kBFloat16: { const uint16_t h = BFloat16FromFloat(f); std::memcpy(p, &h, 2); return; }
    default: std::memcpy(p, &f, 4); return;
  }
}

}  // namespace

absl::Status ConvertFloats(DType from, const void* src, DType to, void* dst, size_t n) {
  if (!IsFloatingDType(from) || !IsFloatingDType(to)) {
    return absl::InvalidArgumentError(absl::StrCat("cannot convert ", DTypeName(from), " to ",
                                                   DTypeName(to), ": only floating dtypes convert"));
  }
  const size_t in = DTypeSize(from), out = DTypeSize(to);
  if (from == to) {
    if (dst != src) std::memmove(dst, src, n * in);
    return absl::OkStatus();
  }
  const char* s = static_cast<const char*>(src);
  char* d = static_cast<char*>(dst);
  for (size_t i = 0; i < n; ++i) {
    Store(to, Load(from, s + i * in), d + i * out);
  }
  return absl::OkStatus();
}

}  // namespace ckpt::internal
