#include "util/work_queue.h"

#include <algorithm>
#include <utility>

#include "util/background_thread.h"

namespace ckpt::internal {

WorkQueue::WorkQueue(int threads, const char* name) {
  for (int i = 0; i < std::max(1, threads); ++i) {
    threads_.emplace_back([this, name] {
      BecomeBackgroundThread(name, 0);
      Loop();
    });
  }
}

WorkQueue::~WorkQueue() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

void WorkQueue::Post(std::function<void()> task) {
  MutexLock lock(&mu_);
  tasks_.push_back(std::move(task));
}

void WorkQueue::Loop() {
  while (true) {
    std::function<void()> task;
    {
      MutexLock lock(&mu_);
      mu_.Await([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stopping, and nothing left to run
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

}  // namespace ckpt::internal
