// `DeviceCopier`: copies accelerator memory into staging chunks
// asynchronously. The CUDA implementation lives in src/cuda/ and is built
// only when the CUDA toolkit is found; tests use a fake.
#ifndef CKPT_STAGING_DEVICE_COPIER_H_
#define CKPT_STAGING_DEVICE_COPIER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ckpt::internal {

// A device and one of its streams (a cudaStream_t; nullptr is the legacy
// default stream).
struct DeviceStream {
  int device = 0;
  void* stream = nullptr;
  bool operator==(const DeviceStream&) const = default;
};

// A point in the work queued on some caller streams: what a save's copies
// must be ordered after. Released with the save (after its copies landed).
class CallerStreamMark {
 public:
  virtual ~CallerStreamMark() = default;
};

// Used by one thread at a time (the stager), except `MarkCallerStreams`.
class DeviceCopier {
 public:
  virtual ~DeviceCopier() = default;

  // Marks, now, the work queued so far on each of `streams`. Called on the
  // caller's thread when a save starts, so the save's copies are ordered
  // after the state the caller saved — not after whatever it queued by the
  // time the stager reaches them (a lazily staged save may be copied during
  // the caller's next forward pass). Thread-safe: may run while the stager is
  // inside the other methods.
  virtual absl::StatusOr<std::unique_ptr<CallerStreamMark>> MarkCallerStreams(
      std::span<const DeviceStream> streams) = 0;

  // Queues a copy of `n` bytes from device memory `src` on `device` into
  // host memory `dst`, ordered after the work `mark` saw on `caller_stream`
  // (after all work queued so far on it when `mark` is null or does not
  // cover that stream), but never waiting for other streams or the whole
  // device.
  virtual absl::Status CopyAsync(void* dst, const void* src, size_t n, int device,
                                 void* caller_stream, const CallerStreamMark* mark) = 0;
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
