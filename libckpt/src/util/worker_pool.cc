#include "util/worker_pool.h"

#include <sched.h>

#include <algorithm>

#include "util/background_thread.h"

namespace ckpt::internal {

WorkerPool::WorkerPool(int threads, const char* name, int nice) {
  for (int i = 1; i < std::max(1, threads); ++i) {
    helpers_.emplace_back([this, name, nice] {
      BecomeBackgroundThread(name, nice);
      HelperLoop();
    });
  }
}

WorkerPool::~WorkerPool() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : helpers_) t.join();
}

int WorkerPool::DefaultThreads(int requested) {
  if (requested > 0) return requested;
  cpu_set_t set;
  int cores = 1;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) cores = CPU_COUNT(&set);
  return std::clamp(cores, 1, 8);
}

void WorkerPool::RunIterations() {
  mu_.Lock();
  while (fn_ != nullptr && next_ < count_) {
    const size_t i = next_++;
    const std::function<void(size_t)>* fn = fn_;
    mu_.UnlockQuietly();  // nobody waits for an iteration to start
    (*fn)(i);
    mu_.Lock();
    ++done_;
  }
  mu_.Unlock();  // wakes the caller waiting for done_ == count_
}

void WorkerPool::HelperLoop() {
  uint64_t seen = 0;
  while (true) {
    {
      MutexLock lock(&mu_);
      mu_.Await([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || (generation_ != seen && fn_ != nullptr && next_ < count_);
      });
      if (stopping_) return;
      seen = generation_;
    }
    RunIterations();
  }
}

void WorkerPool::ParallelFor(size_t n, const std::function<void(size_t)>& fn) {
  if (n == 0) return;
  if (helpers_.empty() || n == 1) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  MutexLock call(&call_mu_);
  {
    MutexLock lock(&mu_);
    fn_ = &fn;
    next_ = 0;
    count_ = n;
    done_ = 0;
    ++generation_;
  }
  RunIterations();
  MutexLock lock(&mu_);
  mu_.Await([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_ == count_; });
  fn_ = nullptr;
}

}  // namespace ckpt::internal
