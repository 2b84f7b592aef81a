// `LazyStager`: the thread that stages lazily staged saves
// (`EngineOptions::lazy_staging`), one at a time, in the order they were
// started, while the caller's loop computes.
#ifndef CKPT_ENGINE_LAZY_STAGER_H_
#define CKPT_ENGINE_LAZY_STAGER_H_

#include <deque>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "engine/save_job.h"
#include "engine/stager.h"
#include "staging/staging_pool.h"
#include "util/mutex.h"

namespace ckpt::internal {

class LazyStager {
 public:
  explicit LazyStager(StagingPool* pool);
  ~LazyStager();  // `Stop`s

  // Queues `request`; its job's `FinishStaging` is called on this thread
  // once staged. `blocked_s` and `blocked_cpu_s`: how long `SaveAsync` held
  // its caller, for the job's figures.
  void Enqueue(StagingRequest request, double blocked_s, double blocked_cpu_s);
  // Stages what is queued, then joins the thread.
  void Stop();

 private:
  struct Queued {
    StagingRequest request;
    double blocked_s = 0;
    double blocked_cpu_s = 0;
  };

  void Run();

  StagingPool* const pool_;
  Mutex mu_;
  std::deque<Queued> jobs_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace ckpt::internal

#endif  // CKPT_ENGINE_LAZY_STAGER_H_
