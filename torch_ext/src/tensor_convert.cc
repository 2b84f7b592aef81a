#include "tensor_convert.h"

#include <memory>
#include <utility>

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>
#include <torch/version.h>

#if defined(CKPT_TORCH_WITH_CUDA) && __has_include(<c10/cuda/CUDAStream.h>)
#include <c10/cuda/CUDAStream.h>
#define CKPT_TORCH_CUDA_STREAMS 1
#endif

// LibTorch 2.3 added the unsigned 16/32/64-bit dtypes.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define CKPT_TORCH_HAS_UINT_WIDE 1
#endif
// 2.2 has every 8-bit float but float8_e8m0fnu, which came with 2.7.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 2)
#define CKPT_TORCH_HAS_FLOAT8 1
#endif
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 7)
#define CKPT_TORCH_HAS_FLOAT8_E8M0 1
#endif

namespace ckpt::torch_ext {
namespace {

// The caller's current stream on `device`, as the raw handle the library
// takes (a cudaStream_t). The stream itself comes from the device-generic
// guard interface; only unpacking its handle needs c10_cuda.
void* CurrentStreamHandle(const c10::Device& device) {
#ifdef CKPT_TORCH_CUDA_STREAMS
  c10::impl::VirtualGuardImpl guard(device.type());
  c10::Stream stream = guard.getStream(device);
  return c10::cuda::CUDAStream(c10::cuda::CUDAStream::UNCHECKED, stream).stream();
#else
  TORCH_CHECK(false, "ckpt: this build of the extension has no CUDA support (built against a "
                     "CPU-only LibTorch); cannot save a tensor on ", device.str());
  return nullptr;
#endif
}

TensorView ViewOf(const std::string& name, const at::Tensor& t, DType dtype) {
  TensorView view;
  view.name = name;
  view.dtype = dtype;
  view.shape.assign(t.sizes().begin(), t.sizes().end());
  view.nbytes = t.numel() * t.element_size();
  view.data = view.nbytes == 0 ? nullptr : t.data_ptr();
  if (t.is_cuda()) {
    view.device = TensorView::Device::kCuda;
    view.device_index = t.device().index();
    view.stream = CurrentStreamHandle(t.device());
  }
  return view;
}

// Fills `view`'s place in its global tensor. A kSharded view takes one
// entry per dimension in each; any other view none.
void SetChunk(const std::string& name, const std::vector<int64_t>& global_shape,
              const std::vector<int64_t>& global_offset, TensorView* view) {
  if (view->placement != TensorPlacement::kSharded) {
    TORCH_CHECK_VALUE(global_shape.empty() && global_offset.empty(), "ckpt: tensor \"", name,
                      "\" has a global shape or offset but is not placed as sharded (3)");
    return;
  }
  const size_t dims = view->shape.size();
  TORCH_CHECK_VALUE(global_shape.size() == dims && global_offset.size() == dims, "ckpt: tensor \"",
                    name, "\" is a chunk of ", dims, " dimensions, but its global shape ",
                    c10::IntArrayRef(global_shape), " and offset ", c10::IntArrayRef(global_offset),
                    " do not have one entry per dimension");
  view->global_shape = global_shape;
  view->global_offset = global_offset;
}

}  // namespace

std::optional<DType> ToCkptDType(c10::ScalarType type) {
  switch (type) {
    case c10::ScalarType::Bool: return DType::kBool;
    case c10::ScalarType::Byte: return DType::kUInt8;
    case c10::ScalarType::Char: return DType::kInt8;
    case c10::ScalarType::Short: return DType::kInt16;
    case c10::ScalarType::Int: return DType::kInt32;
    case c10::ScalarType::Long: return DType::kInt64;
    case c10::ScalarType::Half: return DType::kFloat16;
    case c10::ScalarType::BFloat16: return DType::kBFloat16;
    case c10::ScalarType::Float: return DType::kFloat32;
    case c10::ScalarType::Double: return DType::kFloat64;
    case c10::ScalarType::ComplexFloat: return DType::kComplex64;
    case c10::ScalarType::ComplexDouble: return DType::kComplex128;
#ifdef CKPT_TORCH_HAS_FLOAT8
    case c10::ScalarType::Float8_e4m3fn: return DType::kFloat8E4M3Fn;
    case c10::ScalarType::Float8_e5m2: return DType::kFloat8E5M2;
    case c10::ScalarType::Float8_e4m3fnuz: return DType::kFloat8E4M3Fnuz;
    case c10::ScalarType::Float8_e5m2fnuz: return DType::kFloat8E5M2Fnuz;
#endif
#ifdef CKPT_TORCH_HAS_FLOAT8_E8M0
    case c10::ScalarType::Float8_e8m0fnu: return DType::kFloat8E8M0Fnu;
#endif
#ifdef CKPT_TORCH_HAS_UINT_WIDE
    case c10::ScalarType::UInt16: return DType::kUInt16;
    case c10::ScalarType::UInt32: return DType::kUInt32;
    case c10::ScalarType::UInt64: return DType::kUInt64;
#endif
    default: return std::nullopt;
  }
}

std::optional<c10::ScalarType> ToTorchDType(DType dtype) {
  switch (dtype) {
    case DType::kBool: return c10::ScalarType::Bool;
    case DType::kUInt8: return c10::ScalarType::Byte;
    case DType::kInt8: return c10::ScalarType::Char;
    case DType::kInt16: return c10::ScalarType::Short;
    case DType::kInt32: return c10::ScalarType::Int;
    case DType::kInt64: return c10::ScalarType::Long;
    case DType::kFloat16: return c10::ScalarType::Half;
    case DType::kBFloat16: return c10::ScalarType::BFloat16;
    case DType::kFloat32: return c10::ScalarType::Float;
    case DType::kFloat64: return c10::ScalarType::Double;
    case DType::kComplex64: return c10::ScalarType::ComplexFloat;
    case DType::kComplex128: return c10::ScalarType::ComplexDouble;
#ifdef CKPT_TORCH_HAS_FLOAT8
    case DType::kFloat8E4M3Fn: return c10::ScalarType::Float8_e4m3fn;
    case DType::kFloat8E5M2: return c10::ScalarType::Float8_e5m2;
    case DType::kFloat8E4M3Fnuz: return c10::ScalarType::Float8_e4m3fnuz;
    case DType::kFloat8E5M2Fnuz: return c10::ScalarType::Float8_e5m2fnuz;
#endif
#ifdef CKPT_TORCH_HAS_FLOAT8_E8M0
    case DType::kFloat8E8M0Fnu: return c10::ScalarType::Float8_e8m0fnu;
#endif
#ifdef CKPT_TORCH_HAS_UINT_WIDE
    case DType::kUInt16: return c10::ScalarType::UInt16;
    case DType::kUInt32: return c10::ScalarType::UInt32;
    case DType::kUInt64: return c10::ScalarType::UInt64;
#endif
    default: return std::nullopt;
  }
}

std::string DTypeNameOf(c10::ScalarType type) {
  std::optional<DType> d = ToCkptDType(type);
  return d ? std::string(DTypeName(*d)) : std::string(c10::toString(type));
}

SaveInputs MakeSaveInputs(const std::vector<std::string>& names, at::TensorList tensors,
                          const std::vector<int64_t>& placements,
                          const std::vector<std::vector<int64_t>>& global_shapes,
                          const std::vector<std::vector<int64_t>>& global_offsets) {
  TORCH_CHECK_VALUE(names.size() == tensors.size(), "ckpt: save got ", names.size(),
                    " names but ", tensors.size(), " tensors");
  TORCH_CHECK_VALUE(placements.empty() || placements.size() == tensors.size(), "ckpt: save got ",
                    tensors.size(), " tensors but ", placements.size(), " placements");
  TORCH_CHECK_VALUE(global_shapes.empty() || global_shapes.size() == tensors.size(),
                    "ckpt: save got ", tensors.size(), " tensors but ", global_shapes.size(),
                    " global shapes");
  TORCH_CHECK_VALUE(global_offsets.size() == global_shapes.size(), "ckpt: save got ",
                    global_shapes.size(), " global shapes but ", global_offsets.size(),
                    " global offsets");
  SaveInputs in;
  in.views.reserve(tensors.size());
  in.owners.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    TORCH_CHECK_VALUE(t.defined(), "ckpt: tensor \"", names[i], "\" is undefined");
    TORCH_CHECK_VALUE(t.layout() == c10::kStrided, "ckpt: tensor \"", names[i],
                      "\" is not dense (layout ", t.layout(), "); only strided tensors are saved");
    TORCH_CHECK_VALUE(t.is_cpu() || t.is_cuda(), "ckpt: tensor \"", names[i], "\" is on ",
                      t.device().str(), "; only CPU and CUDA tensors are saved");
    std::optional<DType> dtype = ToCkptDType(t.scalar_type());
    TORCH_CHECK_TYPE(dtype.has_value(), "ckpt: tensor \"", names[i], "\" has dtype ",
                     t.scalar_type(), ", which a checkpoint cannot hold");
    // A contiguous tensor is read where it lies; any other gets a contiguous
    // copy (queued on the current stream, for a CUDA tensor) that lives as
    // long as the caller's tensors are held.
    at::Tensor owner = t.is_contiguous() ? t : t.contiguous();
    in.any_device = in.any_device || owner.is_cuda();
    in.views.push_back(ViewOf(names[i], owner, *dtype));
    if (!placements.empty()) {
      const int64_t p = placements[i];
      TORCH_CHECK_VALUE(p >= 0 && p <= static_cast<int64_t>(TensorPlacement::kSharded),
                        "ckpt: placement of tensor \"", names[i], "\" is ", p,
                        "; expected 0 (default), 1 (replicated), 2 (rank-local) or 3 (sharded)");
      in.views.back().placement = static_cast<TensorPlacement>(p);
    }
    if (!global_shapes.empty()) SetChunk(names[i], global_shapes[i], global_offsets[i], &in.views.back());
    in.owners.push_back(std::move(owner));
  }
  return in;
}

at::Tensor FromCkptTensor(Tensor tensor) {
  std::optional<c10::ScalarType> type = ToTorchDType(tensor.dtype);
  TORCH_CHECK_TYPE(type.has_value(), "ckpt: tensor \"", tensor.name, "\" has dtype ",
                   std::string(DTypeName(tensor.dtype)), ", which this LibTorch (",
                   TORCH_VERSION_MAJOR, ".", TORCH_VERSION_MINOR, ") has no type for");
  auto options = at::TensorOptions().dtype(*type).device(c10::kCPU);
  if (tensor.nbytes() == 0) return at::empty(tensor.shape, options);
  // The at::Tensor takes the bytes over: the deleter frees them.
  auto* owned = new AlignedBytes(std::move(tensor.bytes));
  return at::from_blob(
      owned->data(), tensor.shape, [owned](void*) { delete owned; }, options);
}

}  // namespace ckpt::torch_ext
