// `SaveJob`: one save on its way from the caller's tensors to a committed
// checkpoint, shared by the stager (which fills staging chunks), the
// persister (which writes and commits them), the watchdog, and the caller's
// `SaveHandle`.
#ifndef CKPT_ENGINE_SAVE_JOB_H_
#define CKPT_ENGINE_SAVE_JOB_H_

#include <time.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "util/mutex.h"
#include "ckpt/engine.h"
#include "format/shard_plan.h"
#include "staging/device_copier.h"

namespace ckpt::internal {

using Clock = std::chrono::steady_clock;
inline double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}
// CPU time the calling thread has used, in seconds.
inline double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// A staging chunk holding bytes [file_offset, file_offset + bytes) of shard
// `shard`, ready to be written.
struct StagedChunk {
  size_t shard = 0;
  uint64_t file_offset = 0;
  size_t chunk = 0;
  size_t bytes = 0;
};

// Where a save is, for the watchdog's reports.
enum class SaveStage : uint8_t {
  kQueued,      // behind an earlier save
  kStaging,     // copying into staging memory (or the persister waits for it)
  kEncoding,    // delta or zstd encoding on the persister
  kWriting,     // waiting for shard writes
  kCommitting,  // truncate, fsync, manifest, rename
};
const char* SaveStageName(SaveStage stage);

class SaveJob final : public SaveHandle {
 public:
  SaveJob(int64_t step, std::string extras_json, std::vector<TensorView> tensors,
          std::vector<PlannedShard> plan, std::string final_name, std::string temp_dir)
      : step_(step),
        extras_json(std::move(extras_json)),
        tensors(std::move(tensors)),
        plan(std::move(plan)),
        final_name(std::move(final_name)),
        temp_dir(std::move(temp_dir)),
        hashes(this->tensors.size(), 0) {
    Touch();
  }

  // SaveHandle.
  int64_t step() const override { return step_; }
  absl::Status WaitStaged() override;
  absl::Status Wait() override;
  bool Done() const override;
  bool skipped() const override;
  SaveStats stats() const override;

  // Called before the job is handed to the persister: hold its writes back
  // until staging finishes or the stager runs out of chunks
  // (`WakePersister`). Used while a caller is blocked copying, so the writes
  // do not compete with that copy for the CPU and memory bandwidth.
  void DeferWritesUntilStaged() { defer_writes_ = true; }

  // --- Stager side ---
  // Hands a filled chunk to the persister (waking it once per batch, never
  // while writes are deferred).
  void PushChunk(const StagedChunk& chunk);
  // Wakes the persister for the chunks handed over so far and ends any
  // deferral. The stager calls it before it blocks for a free chunk:
  // otherwise a persister asleep on a partial batch (or deferring) and a
  // stager waiting for chunks only it can free deadlock.
  void WakePersister();
  // Staging finished (OK) or failed; wakes `WaitStaged` and the persister.
  void FinishStaging(absl::Status status);

  // --- Persister side ---
  // Moves ready chunks into `out`; waits for some (or for staging to finish,
  // or, with `stop_on_abort`, for `Abort`) only when `block`. Returns false
  // once staging has finished and every chunk was taken.
  bool TakeChunks(bool block, bool stop_on_abort, std::vector<StagedChunk>* out);
  absl::Status staging_status() const;
  // Records the outcome (once) and wakes `WaitStaged` and `Wait`.
  void Finish(absl::Status status, SaveStats stats);
  void MarkSkipped(SaveStats stats);
  // Whether the caller saw the outcome through `Wait`: an unseen failure is
  // reported by the next `SaveAsync` or by `Close`.
  bool error_reported() const;
  void MarkErrorReported();

  // --- Failing a save from any thread ---
  // The save cannot succeed any more (its writing failed, the engine is
  // closing with kCancel, or it stalled): sets `abort`, so the stager stops
  // at its next chunk and the persister at its next step, and wakes the
  // persister if it waits for chunks. The first reason is the save's outcome.
  void Abort(absl::Status reason);
  absl::Status abort_reason() const;
  // The persister is about to rename the checkpoint into place: returns false
  // (and the save must not commit) if it was aborted; after true, `Expire`
  // refuses.
  bool BeginCommit();
  // The watchdog gives up on a stalled save: aborts it with `reason` and
  // hands `reason` to every `WaitStaged`/`Wait` now, without waiting for the
  // persister (which may be stuck in a system call) to notice. Returns false,
  // doing nothing, once the save is done or committing.
  bool Expire(absl::Status reason);
  bool expired() const;

  // --- Watchdog ---
  void Touch() { last_progress_ns_.store(Clock::now().time_since_epoch().count()); }
  Clock::duration since_progress() const {
    return Clock::now().time_since_epoch() - Clock::duration(last_progress_ns_.load());
  }
  std::atomic<bool> stall_reported{false};
  // True once `Abort` was called: read without the lock on hot paths.
  std::atomic<bool> abort{false};
  std::atomic<SaveStage> stage{SaveStage::kQueued};

  // Immutable after construction, except as noted.
  const int64_t step_;
  const std::string extras_json;
  const std::vector<TensorView> tensors;  // caller's memory; valid until staged
  const std::vector<PlannedShard> plan;
  const std::string final_name;
  const std::string temp_dir;
  std::vector<uint64_t> hashes;  // XXH3-64 per tensor: persister-owned (engine/record_hasher.h)
  Clock::time_point start_time = Clock::now();
  // Copies device tensors; null when the save has none.
  DeviceCopier* copier = nullptr;
  // The caller's streams as they were at `SaveAsync` (with `copier`).
  std::unique_ptr<CallerStreamMark> stream_mark;
  // Persister-owned: when it took the first staged chunk to write.
  std::optional<Clock::time_point> writing_since;
  // Stager-owned figures, published by `FinishStaging`.
  double blocked_s = 0;
  double blocked_cpu_s = 0;
  double staging_s = 0;
  double staging_wait_s = 0;

 private:
  bool WritesAllowed() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !defer_writes_ || writes_released_ || staging_done_;
  }

  mutable Mutex mu_;
  std::deque<StagedChunk> ready_ ABSL_GUARDED_BY(mu_);
  bool staging_done_ ABSL_GUARDED_BY(mu_) = false;
  bool defer_writes_ = false;  // set before the persister sees the job
  bool writes_released_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status staging_status_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  bool skipped_ ABSL_GUARDED_BY(mu_) = false;
  bool error_reported_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status abort_reason_ ABSL_GUARDED_BY(mu_);
  bool committing_ ABSL_GUARDED_BY(mu_) = false;
  bool expired_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  SaveStats stats_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> last_progress_ns_{0};
};

}  // namespace ckpt::internal

#endif  // CKPT_ENGINE_SAVE_JOB_H_
