// `DeviceCopier`: copies accelerator memory into staging chunks
// asynchronously. The CUDA implementation lives in src/cuda/ and is built
// only when the CUDA toolkit is found; tests use a fake.
#ifndef CKPT_STAGING_DEVICE_COPIER_H_
#define CKPT_STAGING_DEVICE_COPIER_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ckpt::internal {

// Used by one thread at a time (the stager).
class DeviceCopier {
 public:
  virtual ~DeviceCopier() = default;
  // Queues a copy of `n` bytes from device memory `src` on `device` into
  // host memory `dst`, ordered after all work queued so far on
  // `caller_stream` (a cudaStream_t; nullptr is the legacy default stream)
  // but never waiting for other streams or the whole device.
  virtual absl::Status CopyAsync(void* dst, const void* src, size_t n, int device,
                                 void* caller_stream) = 0;
  // A token for "every copy queued so far".
  virtual absl::StatusOr<uint64_t> Record() = 0;
  // Blocks until the copies before `token` have landed in host memory.
  virtual absl::Status WaitFor(uint64_t token) = 0;
};

// The CUDA copier, or kUnavailable saying why not (built without CUDA, no
// driver, no device).
absl::StatusOr<std::unique_ptr<DeviceCopier>> NewCudaCopier();

// Test hook: engines opened after this call use `factory` instead of
// `NewCudaCopier` (nullptr restores the default).
using DeviceCopierFactory = absl::StatusOr<std::unique_ptr<DeviceCopier>> (*)();
void SetDeviceCopierFactoryForTesting(DeviceCopierFactory factory);

}  // namespace ckpt::internal

#endif  // CKPT_STAGING_DEVICE_COPIER_H_
