#include "staging/host_pinning.h"

#include <sys/mman.h>

#include "absl/strings/str_cat.h"
#include "util/log.h"

#ifdef CKPT_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace ckpt::internal {

bool CudaDeviceAvailable() {
#ifdef CKPT_HAVE_CUDA
  static const bool available = [] {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      Log(LogLevel::kDebug, absl::StrCat("no CUDA device: ", cudaGetErrorString(err)));
      return false;
    }
    return count > 0;
  }();
  return available;
#else
  return false;
#endif
}

PinKind PinHostMemory(void* data, size_t size) {
  if (size == 0) return PinKind::kNone;
#ifdef CKPT_HAVE_CUDA
  if (CudaDeviceAvailable()) {
    if (cudaHostRegister(data, size, cudaHostRegisterDefault) == cudaSuccess) {
      return PinKind::kCudaHostRegister;
    }
    (void)cudaGetLastError();
  }
#endif
  if (::mlock(data, size) == 0) return PinKind::kMlock;
  Log(LogLevel::kDebug, absl::StrCat("mlock of ", size, " staging bytes refused; staying pageable"));
  return PinKind::kNone;
}

void UnpinHostMemory(void* data, size_t size, PinKind kind) {
  switch (kind) {
    case PinKind::kCudaHostRegister:
#ifdef CKPT_HAVE_CUDA
      (void)cudaHostUnregister(data);
#endif
      break;
    case PinKind::kMlock:
      (void)::munlock(data, size);
      break;
    case PinKind::kNone:
      break;
  }
}

const char* PinKindName(PinKind kind) {
  switch (kind) {
    case PinKind::kCudaHostRegister: return "cudaHostRegister";
    case PinKind::kMlock: return "mlock";
    default: return "pageable";
  }
}

}  // namespace ckpt::internal
