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
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "util/mutex.h"
#include "ckpt/engine.h"
#include "format/shard_plan.h"

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
  kEncoding,    // encoding records (deltas, zstd, planes) on the persister
  kWriting,     // waiting for shard writes
  kCommitting,  // truncate, fsync, manifest, rename
};
const char* SaveStageName(SaveStage stage);

// What staging hands on, once, through `SaveJob::FinishStaging`: its outcome
// and figures (from the stager's thread) and how long `SaveAsync` held its
// caller (from the caller's thread).
struct StagingReport {
  absl::Status status;        // OK: every chunk was handed to the persister
  double staging_s = 0;       // copying into staging memory
  double staging_wait_s = 0;  // part of `staging_s` spent waiting for free chunks
  const char* staging_memory = "";  // how the pool's memory was pinned (`PinKindName`)
  double blocked_s = 0;       // how long `SaveAsync` held its caller
  double blocked_cpu_s = 0;   // CPU time the caller's thread used meanwhile
};

// Threads: the caller's thread constructs the job and hands it to the
// persister and the stager (the caller's thread again, or the lazy stager's);
// the watchdog and the caller's `SaveHandle` look at it from theirs. What is
// fixed by then is `const` and set by the constructor; what one thread hands
// another is guarded by `mu_` (or atomic); what one thread keeps for itself
// (the persister's hashes, the stager's stream mark) is not here.
class SaveJob final : public SaveHandle {
 public:
  // `start_time` is when `SaveAsync` was called. With `defer_writes`, the
  // persister holds the job's writes back until staging finishes or the
  // stager runs out of chunks (`WakePersister`): used while a caller is
  // blocked copying, so the writes do not compete with that copy for the CPU
  // and memory bandwidth.
  SaveJob(int64_t step, std::string extras_json, std::vector<TensorView> tensors,
          std::vector<PlannedShard> plan, std::string final_name, std::string temp_dir,
          Clock::time_point start_time, bool defer_writes)
      : step_(step),
        extras_json(std::move(extras_json)),
        tensors(std::move(tensors)),
        plan(std::move(plan)),
        final_name(std::move(final_name)),
        temp_dir(std::move(temp_dir)),
        start_time(start_time),
        defer_writes_(defer_writes) {
    Touch();
  }

  // SaveHandle.
  int64_t step() const override { return step_; }
  absl::Status WaitStaged() override;
  absl::Status Wait() override;
  bool Done() const override;
  bool skipped() const override;
  SaveStats stats() const override;

  // --- Stager side ---
  // Hands a filled chunk to the persister (waking it once per batch, never
  // while writes are deferred).
  void PushChunk(const StagedChunk& chunk);
  // Wakes the persister for the chunks handed over so far and ends any
  // deferral. The stager calls it before it blocks for a free chunk:
  // otherwise a persister asleep on a partial batch (or deferring) and a
  // stager waiting for chunks only it can free deadlock.
  void WakePersister();
  // Staging finished (`report.status` OK) or failed; wakes `WaitStaged` and
  // the persister.
  void FinishStaging(StagingReport report);

  // --- Persister side ---
  // Moves ready chunks into `out`; waits for some (or for staging to finish,
  // or, with `stop_on_abort`, for `Abort`) only when `block`. Returns false
  // once staging has finished and every chunk was taken.
  bool TakeChunks(bool block, bool stop_on_abort, std::vector<StagedChunk>* out);
  absl::Status staging_status() const;
  // What `FinishStaging` handed over: complete once `TakeChunks` returned false.
  StagingReport staging_report() const;
  // Records the outcome (once) and wakes `WaitStaged` and `Wait`.
  void Finish(absl::Status status, SaveStats stats);
  // `SaveAsync`, instead of handing the job on: the save was skipped.
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
  // Read and set by the watchdog only, under the engine's lock.
  std::atomic<bool> stall_reported{false};
  // True once `Abort` was called: read without the lock on hot paths.
  std::atomic<bool> abort{false};
  // Set by the stager and the persister, read by the watchdog.
  std::atomic<SaveStage> stage{SaveStage::kQueued};

  // Fixed before any other thread sees the job.
  const int64_t step_;
  const std::string extras_json;
  const std::vector<TensorView> tensors;  // caller's memory; valid until staged
  const std::vector<PlannedShard> plan;
  const std::string final_name;
  const std::string temp_dir;
  const Clock::time_point start_time;
  // A multi-rank save: the digest of the replicated tensors the caller
  // declared (ReplicatedFingerprint), those it does not write included. Set
  // before the job is queued.
  uint64_t replicated_fingerprint = 0;

 private:
  bool WritesAllowed() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !defer_writes_ || writes_released_ || staging_done_;
  }

  const bool defer_writes_;
  mutable Mutex mu_;
  std::deque<StagedChunk> ready_ ABSL_GUARDED_BY(mu_);
  bool staging_done_ ABSL_GUARDED_BY(mu_) = false;
  bool writes_released_ ABSL_GUARDED_BY(mu_) = false;
  StagingReport staging_ ABSL_GUARDED_BY(mu_);  // valid once `staging_done_`
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
