// Converting floating-point tensors between fp16, bf16, fp32 and fp64, with
// the results PyTorch's `Tensor.to(dtype)` gives on a CPU: round to nearest
// even; NaN stays NaN (bf16: the quiet NaN 0x7fc0), infinities and signed
// zeros are kept; fp16 subnormals are produced and read; fp64 goes to fp16
// or bf16 through fp32, as c10's conversions do.
#ifndef CKPT_EXPORT_FLOAT_CONVERT_H_
#define CKPT_EXPORT_FLOAT_CONVERT_H_

#include <cstddef>

#include "absl/status/status.h"
#include "ckpt/dtype.h"

namespace ckpt::internal {

// Converts `n` elements of floating dtype `from` at `src` to floating dtype
// `to` at `dst` (which may not overlap `src` unless `from == to`).
// kInvalidArgument unless both dtypes are floating.
absl::Status ConvertFloats(DType from, const void* src, DType to, void* dst, size_t n);

}  // namespace ckpt::internal

#endif  // CKPT_EXPORT_FLOAT_CONVERT_H_
