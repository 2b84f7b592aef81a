// `ParallelCopier`: one batch of memcpys spread over the calling thread and a
// few helper threads, for copies a caller is blocked on.
#ifndef CKPT_STAGING_PARALLEL_COPIER_H_
#define CKPT_STAGING_PARALLEL_COPIER_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "util/mutex.h"

namespace ckpt::internal {

struct CopyPiece {
  char* dst = nullptr;
  const char* src = nullptr;
  size_t bytes = 0;
};

// One memcpy thread reaches ~6 GB/s on the machines we measure, well below
// what the memory system gives two or more (~10-12 GB/s on two cores): an
// eager save's caller waits on that copy, so it is shared out. The helpers
// sleep between batches and run at the priority of the thread that made the
// copier (the caller is blocked on them; they are not background work).
class ParallelCopier {
 public:
  // `threads` counts the caller: 1 copies on the caller alone (no helpers).
  explicit ParallelCopier(int threads);
  ~ParallelCopier();
  ParallelCopier(const ParallelCopier&) = delete;
  ParallelCopier& operator=(const ParallelCopier&) = delete;

  int threads() const { return static_cast<int>(helpers_.size()) + 1; }

  // Copies every piece and returns once all are done. Pieces are claimed one
  // at a time, so several hundred KiB each keeps the threads evenly busy.
  // Not reentrant: one `Run` at a time.
  void Run(std::span<const CopyPiece> pieces);

  // `threads` for `EngineOptions::staging_threads == 0`: up to 4, no more
  // than the cores this process may run on.
  static int DefaultThreads();

 private:
  void Helper();
  // Copies pieces until none is left unclaimed.
  void Work();

  Mutex mu_;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  int busy_ ABSL_GUARDED_BY(mu_) = 0;  // helpers inside the current batch
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // The batch being copied: set by `Run` before it bumps `generation_`.
  std::span<const CopyPiece> pieces_;
  std::atomic<size_t> next_{0};
  std::vector<std::thread> helpers_;
};

}  // namespace ckpt::internal

#endif  // CKPT_STAGING_PARALLEL_COPIER_H_
