// `WorkerPool`: a fixed set of threads that run the iterations of one
// `ParallelFor` at a time, the calling thread included. Used for CPU-bound
// encoding and decoding (byte planes, zstd), whose unit of work is a block
// of a record, so that a save's or a restore's codec work runs on several
// cores while its I/O runs on the queue.
#ifndef CKPT_UTIL_WORKER_POOL_H_
#define CKPT_UTIL_WORKER_POOL_H_

#include <cstddef>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "util/mutex.h"

namespace ckpt::internal {

class WorkerPool {
 public:
  // `threads` >= 1 counts the caller of `ParallelFor`: 1 runs everything on
  // the caller. Helper threads are named `name` and run `nice` nicer.
  WorkerPool(int threads, const char* name, int nice);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  int threads() const { return static_cast<int>(helpers_.size()) + 1; }

  // Runs fn(0) .. fn(n - 1), each once, on the caller and the helpers;
  // returns when all have returned. Calls from several threads at once are
  // serialized. `fn` must not throw and must not call `ParallelFor`.
  void ParallelFor(size_t n, const std::function<void(size_t)>& fn);

  // Threads for a pool of codec work: `requested` when > 0, else the cores
  // this process may use, at most 8.
  static int DefaultThreads(int requested);

 private:
  void HelperLoop();
  // Takes iterations of the current batch until none is left.
  void RunIterations();

  Mutex call_mu_;  // one ParallelFor at a time
  Mutex mu_;
  const std::function<void(size_t)>* fn_ ABSL_GUARDED_BY(mu_) = nullptr;
  size_t next_ ABSL_GUARDED_BY(mu_) = 0;
  size_t count_ ABSL_GUARDED_BY(mu_) = 0;
  size_t done_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> helpers_;
};

}  // namespace ckpt::internal

#endif  // CKPT_UTIL_WORKER_POOL_H_
