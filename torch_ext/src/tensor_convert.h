// tensor_convert.h: at::Tensor <-> ckpt::TensorView / ckpt::Tensor.
//
// The only place that knows both type systems. Nothing here does I/O.
#ifndef CKPT_TORCH_EXT_TENSOR_CONVERT_H_
#define CKPT_TORCH_EXT_TENSOR_CONVERT_H_

#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "ckpt/dtype.h"
#include "ckpt/tensor.h"

namespace ckpt::torch_ext {

// `ToCkptDType` maps a torch dtype to the library's, or nullopt for a dtype
// a checkpoint cannot hold (complex, quantized, ...).
std::optional<DType> ToCkptDType(c10::ScalarType type);

// `ToTorchDType` maps a library dtype to torch's, or nullopt where this
// LibTorch has no such dtype (uint16/32/64 before 2.3).
std::optional<c10::ScalarType> ToTorchDType(DType dtype);

// `SaveInputs` are the views a save reads, and the tensors that own their
// bytes. `owners` must stay alive until the save's staging completes: they
// hold the caller's tensors and the contiguous copies made of non-contiguous
// ones.
struct SaveInputs {
  std::vector<TensorView> views;
  std::vector<at::Tensor> owners;
  bool any_device = false;  // some view is device (CUDA) memory
};

// `MakeSaveInputs` builds one view per tensor, named by `names` (same
// length). A non-contiguous tensor is first copied into a contiguous
// temporary (kept in `owners`). A CUDA tensor's view carries its device index
// and the current stream of that device, so the library's copy waits only on
// that stream. Throws (TORCH_CHECK) on a length mismatch, an undefined or
// sparse tensor, an unsupported dtype, or a device this build cannot stage.
// `placements` is empty (every view kDefault) or holds one
// `TensorPlacement` value (0 default, 1 replicated, 2 rank-local, 3 sharded)
// per tensor; ValueError otherwise. `global_shapes` and `global_offsets` are
// empty or hold one list per tensor: for a kSharded tensor (a chunk of a
// global tensor) the global tensor's shape and where the chunk starts in it,
// one entry per dimension of the tensor; for any other, an empty list.
SaveInputs MakeSaveInputs(const std::vector<std::string>& names, at::TensorList tensors,
                          const std::vector<int64_t>& placements = {},
                          const std::vector<std::vector<int64_t>>& global_shapes = {},
                          const std::vector<std::vector<int64_t>>& global_offsets = {});

// `FromCkptTensor` wraps a tensor read back from a checkpoint as a CPU
// at::Tensor that owns its bytes (no copy). Throws for a dtype this LibTorch
// lacks.
at::Tensor FromCkptTensor(Tensor tensor);

// `DTypeNameOf` is the library's name for a torch dtype ("float32", ...), or
// torch's own spelling when the library has none; for error messages.
std::string DTypeNameOf(c10::ScalarType type);

}  // namespace ckpt::torch_ext

#endif  // CKPT_TORCH_EXT_TENSOR_CONVERT_H_
