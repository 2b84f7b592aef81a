// `NewCudaCopier` for builds without the CUDA toolkit.
#include "staging/device_copier.h"

#ifndef CKPT_HAVE_CUDA
namespace ckpt::internal {

absl::StatusOr<std::unique_ptr<DeviceCopier>> NewCudaCopier() {
  return absl::UnavailableError("ckpt was built without CUDA (CKPT_WITH_CUDA=OFF or no toolkit)");
}

}  // namespace ckpt::internal
#endif
