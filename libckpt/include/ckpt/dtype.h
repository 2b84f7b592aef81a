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
};

inline constexpr int kNumDTypes = 13;

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

// `IsFloatingDType` is true for fp16, bf16, fp32 and fp64.
bool IsFloatingDType(DType dtype);

}  // namespace ckpt

#endif  // CKPT_DTYPE_H_
