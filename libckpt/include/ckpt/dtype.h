// ckpt/dtype.h: element types a checkpoint can hold.
#ifndef CKPT_DTYPE_H_
#define CKPT_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace ckpt {

// `DType` is the element type of a tensor. The numeric values are stable (they
// are part of no on-disk encoding: the manifest stores `DTypeName`).
enum class DType : uint8_t {
  kBool = 0,
  kUInt8,
  kInt8,
  kInt16,
  kInt32,
  kInt64,
  kUInt16,
  kUInt32,
  kUInt64,
  kFloat16,
  kBFloat16,
  kFloat32,
  kFloat64,
  kComplex64,   // two float32s (real, imaginary), as torch.complex64
  kComplex128,  // two float64s
  kFloat8E4M3Fn,    // torch.float8_e4m3fn (OCP FP8 E4M3)
  kFloat8E5M2,      // torch.float8_e5m2
  kFloat8E4M3Fnuz,  // torch.float8_e4m3fnuz
  kFloat8E5M2Fnuz,  // torch.float8_e5m2fnuz
  kFloat8E8M0Fnu,   // torch.float8_e8m0fnu (MX block scales)
};

inline constexpr int kNumDTypes = 20;

// `DTypeSize` returns the size of one element in bytes (1 for `kBool`), or 0
// for a value outside the enum.
size_t DTypeSize(DType dtype);

// `DTypeName` returns the manifest spelling ("float32", "bfloat16", ...), or
// "invalid" for a value outside the enum.
absl::string_view DTypeName(DType dtype);

// `DTypeFromName` parses a `DTypeName` spelling. Unknown names are
// `kInvalidArgument` naming the text.
absl::StatusOr<DType> DTypeFromName(absl::string_view name);

// `IsValidDType` is true for the enumerators above.
bool IsValidDType(DType dtype);

// `IsFloatingDType` is true for fp16, bf16, fp32 and fp64: the types top-k
// deltas keep the largest changes of and exports convert between. Complex and
// 8-bit float tensors are stored, compressed and delta-coded exactly, like
// integers.
bool IsFloatingDType(DType dtype);

// `DTypeScalarSize` is the size of one real number in an element: half the
// element for the complex types (a real and an imaginary part), the whole
// element otherwise. Byte planes (float compression, xor_planes deltas) are
// cut at this width, so the parts of a complex number are coded like the
// floats they are.
size_t DTypeScalarSize(DType dtype);

}  // namespace ckpt

#endif  // CKPT_DTYPE_H_
