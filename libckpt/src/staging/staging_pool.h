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

  // How `Resize` prepares new memory.
  enum class Preparation {
    // Pre-faulted, page-locked (`cudaHostRegister` when a CUDA device is
    // visible, else mlock) and registered with the I/O queue: what a steady
    // save wants, at ~0.3-0.8 s per GB of first touch and pinning.
    kPinned,
    // Address space only (no page touched): what a save that found the pool
    // too small grows it with, so its caller does not wait for pinning;
    // `Pin` finishes the job later, off the caller's thread.
    kUnpinned,
  };
  // (Re)allocates the pool with `chunks` chunks and prepares them as
  // `preparation` says; `queue` (may be null) gets pinned chunks
  // registered. REQUIRES: no chunk is taken.
  absl::Status Resize(size_t chunks, IoQueue* queue, Preparation preparation = Preparation::kPinned);
  // Pins the pool's memory and registers it with `queue`, if `Resize` left it
  // unpinned; does nothing otherwise. REQUIRES: no chunk is taken.
  absl::Status Pin(IoQueue* queue);
  bool pinned() const;

  // Chunks are handed out lowest index first, so a save that finds the pool
  // idle stages into one contiguous run of memory (device copies into it
  // can then be merged across chunks).
  //
  // Takes a free chunk, waiting for one while all are taken. Returns nullopt
  // if `Cancel` was called, or `*stop` became true (checked when woken: whoever
  // sets it calls `WakeWaiters`), while waiting.
  std::optional<size_t> Acquire(const std::atomic<bool>* stop = nullptr);
  // Makes every `Acquire` waiter re-check its `stop` flag.
  void WakeWaiters();
  // Takes a free chunk if one is free now.
  std::optional<size_t> TryAcquire();
  void Release(size_t chunk);
  // Wakes every `Acquire` waiter with nullopt, now and from then on.
  void Cancel();

  size_t chunk_bytes() const { return chunk_bytes_; }
  size_t count() const;
  size_t free_count() const;
  char* chunk(size_t i) const { return base_ + i * chunk_bytes_; }
  int buf_index(size_t i) const { return registered_ ? static_cast<int>(i) : -1; }
  // (Locks: `Pin` may change it on another thread while stats are read.)
  PinKind pin_kind() const;

 private:
  const size_t chunk_bytes_;
  AlignedBytes memory_;
  char* base_ = nullptr;
  bool registered_ = false;
  PinKind pin_ ABSL_GUARDED_BY(mu_) = PinKind::kNone;
  bool prepared_ = true;  // false from a `kUnpinned` resize until `Pin`
  mutable Mutex mu_;
  size_t count_ ABSL_GUARDED_BY(mu_) = 0;
  size_t TakeLowest() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PinLocked(IoQueue* queue) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::vector<size_t> free_ ABSL_GUARDED_BY(mu_);  // a min-heap of chunk indices
  std::vector<bool> is_free_ ABSL_GUARDED_BY(mu_);  // by chunk: catches a double release
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace ckpt::internal

#endif  // CKPT_STAGING_STAGING_POOL_H_
