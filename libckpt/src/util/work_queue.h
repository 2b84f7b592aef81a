// `WorkQueue`: a few threads that run posted tasks, oldest first. Used where
// one thread must keep a device busy (submitting and reaping I/O) and hand
// what lands to others: a reader's bounce copies and checksums.
#ifndef CKPT_UTIL_WORK_QUEUE_H_
#define CKPT_UTIL_WORK_QUEUE_H_

#include <cstddef>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "util/mutex.h"

namespace ckpt::internal {

class WorkQueue {
 public:
  // `threads` >= 1 threads named `name`; they live until destruction.
  WorkQueue(int threads, const char* name);
  // Runs every task already posted, then joins the threads.
  ~WorkQueue();
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  int threads() const { return static_cast<int>(threads_.size()); }

  // Runs `task` on one of the threads, soon. `task` must not throw. Callers
  // that need to know when their tasks are done count them themselves.
  void Post(std::function<void()> task);

 private:
  void Loop();

  Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace ckpt::internal

#endif  // CKPT_UTIL_WORK_QUEUE_H_
