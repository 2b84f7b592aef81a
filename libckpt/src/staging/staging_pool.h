// `StagingPool`: the engine's host memory for saves in flight. One
// pre-faulted, 4 KiB-aligned, page-locked allocation cut into chunks of
// `chunk_bytes`; a save copies its tensors into chunks, the persister writes
// each chunk to its shard file and gives it back. Memory stays bounded by
// the pool however fast saves are requested.
#ifndef CKPT_STAGING_STAGING_POOL_H_
#define CKPT_STAGING_STAGING_POOL_H_

#include <atomic>
#include <cstddef>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "util/mutex.h"
#include "ckpt/file_system.h"
#include "ckpt/tensor.h"
#include "staging/host_pinning.h"

namespace ckpt::internal {

// Thread-safe.
class StagingPool {
 public:
  explicit StagingPool(size_t chunk_bytes) : chunk_bytes_(chunk_bytes) {}
  ~StagingPool();
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  // (Re)allocates the pool with `chunks` chunks, pre-faulted and pinned, and
  // registers them with `queue` (may be null). REQUIRES: no chunk is taken.
  absl::Status Resize(size_t chunks, IoQueue* queue);

  // Takes a free chunk, waiting for one while all are taken. Returns nullopt
  // if `Cancel` was called, or `*stop` became true (checked when woken: whoever
  // sets it calls `WakeWaiters`), while waiting.
  std::optional<size_t> Acquire(const std::atomic<bool>* stop = nullptr);
  // Makes every `Acquire` waiter re-check its `stop` flag.
  void WakeWaiters();
  // Takes a free chunk if one is free now.
  std::optional<size_t> TryAcquire();
  void Release(size_t chunk);
  // Wakes every `Acquire` waiter with nullopt until `Uncancel`.
  void Cancel();
  void Uncancel();

  size_t chunk_bytes() const { return chunk_bytes_; }
  size_t count() const;
  size_t free_count() const;
  char* chunk(size_t i) const { return base_ + i * chunk_bytes_; }
  int buf_index(size_t i) const { return registered_ ? static_cast<int>(i) : -1; }
  PinKind pin_kind() const { return pin_; }

 private:
  const size_t chunk_bytes_;
  AlignedBytes memory_;
  char* base_ = nullptr;
  bool registered_ = false;
  PinKind pin_ = PinKind::kNone;
  mutable Mutex mu_;
  size_t count_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<size_t> free_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> is_free_ ABSL_GUARDED_BY(mu_);  // by chunk: catches a double release
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace ckpt::internal

#endif  // CKPT_STAGING_STAGING_POOL_H_
