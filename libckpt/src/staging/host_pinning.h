// Page-locking host memory: cudaHostRegister when a CUDA device is present
// (so device->host copies run at full PCIe speed, asynchronously), otherwise
// mlock, best effort.
#ifndef CKPT_STAGING_HOST_PINNING_H_
#define CKPT_STAGING_HOST_PINNING_H_

#include <cstddef>
#include <string>

namespace ckpt::internal {

enum class PinKind { kNone, kMlock, kCudaHostRegister };

// Pins [data, data+size); returns how (kNone if nothing worked, which is not
// an error: the memory is still usable, just pageable).
PinKind PinHostMemory(void* data, size_t size);
void UnpinHostMemory(void* data, size_t size, PinKind kind);
const char* PinKindName(PinKind kind);

// True when the CUDA runtime is built in and sees at least one device.
bool CudaDeviceAvailable();

}  // namespace ckpt::internal

#endif  // CKPT_STAGING_HOST_PINNING_H_
