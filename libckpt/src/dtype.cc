#include "ckpt/dtype.h"

#include <array>

#include "absl/strings/str_cat.h"

namespace ckpt {
namespace {

struct DTypeEntry {
  DType dtype;
  absl::string_view name;
  size_t size;
};

constexpr std::array<DTypeEntry, kNumDTypes> kDTypes = {{
    {DType::kBool, "bool", 1},
    {DType::kUInt8, "uint8", 1},
    {DType::kInt8, "int8", 1},
    {DType::kInt16, "int16", 2},
    {DType::kInt32, "int32", 4},
    {DType::kInt64, "int64", 8},
    {DType::kUInt16, "uint16", 2},
    {DType::kUInt32, "uint32", 4},
    {DType::kUInt64, "uint64", 8},
    {DType::kFloat16, "float16", 2},
    {DType::kBFloat16, "bfloat16", 2},
    {DType::kFloat32, "float32", 4},
    {DType::kFloat64, "float64", 8},
    {DType::kComplex64, "complex64", 8},
    {DType::kComplex128, "complex128", 16},
    {DType::kFloat8E4M3Fn, "float8_e4m3fn", 1},
    {DType::kFloat8E5M2, "float8_e5m2", 1},
    {DType::kFloat8E4M3Fnuz, "float8_e4m3fnuz", 1},
    {DType::kFloat8E5M2Fnuz, "float8_e5m2fnuz", 1},
    {DType::kFloat8E8M0Fnu, "float8_e8m0fnu", 1},
}};

// The table is indexed by the enum's value.
constexpr bool TableFollowsEnum() {
  for (size_t i = 0; i < kDTypes.size(); ++i) {
    if (static_cast<size_t>(kDTypes[i].dtype) != i) return false;
  }
  return true;
}
static_assert(TableFollowsEnum(), "kDTypes must list the DType enumerators in order");

}  // namespace

bool IsValidDType(DType dtype) { return static_cast<size_t>(dtype) < kDTypes.size(); }

size_t DTypeSize(DType dtype) {
  return IsValidDType(dtype) ? kDTypes[static_cast<size_t>(dtype)].size : 0;
}

absl::string_view DTypeName(DType dtype) {
  return IsValidDType(dtype) ? kDTypes[static_cast<size_t>(dtype)].name : "invalid";
}

absl::StatusOr<DType> DTypeFromName(absl::string_view name) {
  for (const DTypeEntry& entry : kDTypes) {
    if (entry.name == name) return entry.dtype;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype \"", name, "\""));
}

size_t DTypeScalarSize(DType dtype) {
  const size_t size = DTypeSize(dtype);
  return dtype == DType::kComplex64 || dtype == DType::kComplex128 ? size / 2 : size;
}

bool IsFloatingDType(DType dtype) {
  return dtype == DType::kFloat16 || dtype == DType::kBFloat16 || dtype == DType::kFloat32 ||
         dtype == DType::kFloat64;
}

}  // namespace ckpt
