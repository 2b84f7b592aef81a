#include "staging/parallel_copier.h"

#include <sched.h>

#include <algorithm>
#include <cstring>

#include "util/background_thread.h"

namespace ckpt::internal {

ParallelCopier::ParallelCopier(int threads) {
  for (int i = 1; i < threads; ++i) helpers_.emplace_back([this] { Helper(); });
}

ParallelCopier::~ParallelCopier() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : helpers_) t.join();
}

int ParallelCopier::DefaultThreads() {
  cpu_set_t set;
  int cores = 0;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) cores = CPU_COUNT(&set);
  if (cores <= 0) cores = static_cast<int>(std::thread::hardware_concurrency());
  return std::clamp(cores, 1, 4);
}

void ParallelCopier::Run(std::span<const CopyPiece> pieces) {
  if (pieces.empty()) return;
  if (helpers_.empty() || pieces.size() == 1) {
    for (const CopyPiece& p : pieces) std::memcpy(p.dst, p.src, p.bytes);
    return;
  }
  {
    MutexLock lock(&mu_);
    pieces_ = pieces;
    next_.store(0, std::memory_order_relaxed);
    busy_ = static_cast<int>(helpers_.size());
    ++generation_;
  }
  Work();
  // Every helper leaves the batch before `pieces` may go out of scope.
  MutexLock lock(&mu_);
  mu_.Await([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return busy_ == 0; });
  pieces_ = {};
}

void ParallelCopier::Work() {
  while (true) {
    const size_t i = next_.fetch_add(1, std::memory_order_relaxed);
    if (i >= pieces_.size()) return;
    const CopyPiece& p = pieces_[i];
    std::memcpy(p.dst, p.src, p.bytes);
  }
}

void ParallelCopier::Helper() {
  BecomeBackgroundThread("ckpt-copy", 0);
  uint64_t seen = 0;
  while (true) {
    {
      MutexLock lock(&mu_);
      mu_.Await([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
    }
    Work();
    MutexLock lock(&mu_);
    --busy_;
  }
}

}  // namespace ckpt::internal
