#include "engine/lazy_stager.h"

#include <memory>
#include <utility>

#include "util/background_thread.h"

namespace ckpt::internal {

LazyStager::LazyStager(StagingPool* pool) : pool_(pool), thread_([this] { Run(); }) {}

LazyStager::~LazyStager() { Stop(); }

void LazyStager::Enqueue(StagingRequest request, double blocked_s, double blocked_cpu_s) {
  MutexLock lock(&mu_);
  jobs_.push_back(Queued{std::move(request), blocked_s, blocked_cpu_s});
}

void LazyStager::Stop() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void LazyStager::Run() {
  // Not niced: the loop waits for this copy before it changes the tensors,
  // so it is the loop's own work, done while the loop computes.
  BecomeBackgroundThread("ckpt-stage", 0);
  while (true) {
    Queued next;
    {
      MutexLock lock(&mu_);
      mu_.Await([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !jobs_.empty();
      });
      if (jobs_.empty()) return;
      next = std::move(jobs_.front());
      jobs_.pop_front();
    }
    const std::shared_ptr<SaveJob> job = next.request.job;
    StagingReport report = StageJob(std::move(next.request), *pool_, /*host=*/nullptr);
    report.blocked_s = next.blocked_s;
    report.blocked_cpu_s = next.blocked_cpu_s;
    job->FinishStaging(std::move(report));
  }
}

}  // namespace ckpt::internal
