// `EngineImpl`: the `Engine` that `Engine::Open` returns. Its members are
// defined by concept:
//   engine/engine_open.cc      Open, starting the threads, Close
//   engine/save_async.cc       admitting, planning and staging a save
//   engine/staging_memory.cc   sizing the staging pool (and ReserveStaging)
//   engine/save_completion.cc  what a finished save leaves: stats, metrics,
//                              errors no handle reported yet
//   engine/watchdog.cc         stalled saves (warnings, `stall_timeout`) and
//                              the preemption deadline
//
// Threads: callers (`SaveAsync`, `ReserveStaging`, `Close`, `stats`), the
// persister (`OnSaveDone`), the watchdog (`Watch`), the lazy stager
// (engine/lazy_stager.h) and reservation threads (`Reserve`).
#ifndef CKPT_ENGINE_ENGINE_IMPL_H_
#define CKPT_ENGINE_ENGINE_IMPL_H_

#include <cstdint>
#include <deque>
#include <future>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ckpt/engine.h"
#include "ckpt/file_system.h"
#include "ckpt/root_lock.h"
#include "distributed/rank_commit.h"
#include "engine/lazy_stager.h"
#include "engine/metrics.h"
#include "engine/persister.h"
#include "engine/save_job.h"
#include "engine/stager.h"
#include "format/shard_plan.h"
#include "io/backend.h"
#include "object/background_tier.h"
#include "staging/device_copier.h"
#include "staging/parallel_copier.h"
#include "staging/staging_pool.h"
#include "util/mutex.h"

namespace ckpt::internal {

// The codec and level full records are written with: `compression`, or
// zstd at `compression_level` when only that is set (level >= 1).
CompressionOptions EffectiveCompression(const EngineOptions& options);

// OK when every field of `options` is in its range (and the distributed
// ones fit together); else kInvalidArgument naming the first that is not.
// Touches nothing: `Engine::Open` calls it before the root.
absl::Status ValidateEngineOptions(const EngineOptions& options);

// How long `SaveAsync` has held its caller, in wall and CPU time, since it
// was called.
class CallerClock {
 public:
  Clock::time_point start() const { return start_; }
  double seconds() const { return SecondsSince(start_); }
  double cpu_seconds() const { return ThreadCpuSeconds() - start_cpu_; }

 private:
  const Clock::time_point start_ = Clock::now();
  const double start_cpu_ = ThreadCpuSeconds();
};

class EngineImpl final : public Engine {
 public:
  // `writer_lock` and `committer` may be null (a multi-rank engine's ranks
  // but 0 hold no lock; a single-process engine has no committer).
  EngineImpl(std::string root, EngineOptions options, std::shared_ptr<FileSystem> fs,
             std::unique_ptr<FileLock> writer_lock, OpenedIo backend,
             std::unique_ptr<RankCommitter> committer);
  // Sizes a fixed staging pool and starts the persister, the lazy stager (or
  // the host copier) and the watchdog.
  absl::Status Start();
  ~EngineImpl() override;

  absl::StatusOr<std::shared_ptr<SaveHandle>> SaveAsync(int64_t step,
                                                        std::span<const TensorView> tensors,
                                                        absl::string_view extras_json) override
      ABSL_LOCKS_EXCLUDED(staging_mu_, mu_);
  absl::StatusOr<SaveStats> Save(int64_t step, std::span<const TensorView> tensors,
                                 absl::string_view extras_json) override
      ABSL_LOCKS_EXCLUDED(staging_mu_, mu_);
  absl::Status ReserveStaging(std::span<const TensorView> tensors, bool wait) override
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Close(CloseMode mode) override ABSL_LOCKS_EXCLUDED(staging_mu_, mu_);
  EngineStats stats() const override ABSL_LOCKS_EXCLUDED(mu_);
  const std::string& root() const override { return root_; }
  const TierUploader* tier() const override { return tier_.get(); }
  // Before `Start`: the uploads behind the save (`EngineOptions::tier`).
  void AttachTier(std::unique_ptr<BackgroundTier> tier) { tier_ = std::move(tier); }
  absl::string_view backend() const override { return backend_.description; }

 private:
  // The steps of `SaveAsync` (engine/save_async.cc), in order, after
  // `ValidateSave` and `TakeUnreportedError`.
  //
  // Fails unless the engine is open and `step` is neither being saved nor
  // committed in ROOT.
  absl::Status AdmitStep(int64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(staging_mu_)
      ABSL_LOCKS_EXCLUDED(mu_);
  size_t SavesInFlight() const ABSL_LOCKS_EXCLUDED(mu_);
  // Grows the pool for a save of `step` that needs `needed` chunks, when
  // nothing is in flight (engine/staging_memory.cc): unpinned, with a
  // reservation scheduled that pins it once the save is written. True when
  // it grew the pool.
  absl::StatusOr<bool> SizePoolForSave(int64_t step, size_t needed, size_t in_flight)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(staging_mu_) ABSL_LOCKS_EXCLUDED(mu_);
  // The copier for `tensors`' device tensors (made on the first save that
  // has any); null when all are host tensors.
  absl::StatusOr<DeviceCopier*> DeviceCopierFor(std::span<const TensorView> tensors)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(staging_mu_);
  std::shared_ptr<SaveJob> NewJob(int64_t step, std::span<const TensorView> tensors,
                                  absl::string_view extras_json, std::vector<PlannedShard> plan,
                                  Clock::time_point start, bool has_device)
      ABSL_LOCKS_EXCLUDED(mu_);
  // `BusyPolicy::kSkip`: saves in flight hold the staging memory this one needs.
  bool ShouldSkip(size_t needed, size_t in_flight) const;
  // Completes `job` as skipped, without handing it on.
  void Skip(SaveJob& job, const CallerClock& clock) ABSL_LOCKS_EXCLUDED(mu_);
  void TrackInFlight(const std::shared_ptr<SaveJob>& job) ABSL_LOCKS_EXCLUDED(mu_);
  // Stages `request` on this thread (eager) or queues it for the lazy
  // stager; the job's `FinishStaging` gets the report either way.
  void Stage(StagingRequest request, const CallerClock& clock)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(staging_mu_);

  // Of `tensors`, those this engine writes: all of them, or for a rank of
  // a multi-rank engine its own and the replicated ones it owns.
  std::vector<TensorView> TensorsThisRankWrites(std::span<const TensorView> tensors) const;

  // `EngineOptions::background_nice`, with -1 resolved.
  int BackgroundNice() const;
  uint64_t NextNonce() ABSL_LOCKS_EXCLUDED(mu_);

  // Staging chunks a save of `plan` needs.
  size_t StagingChunksFor(const std::vector<PlannedShard>& plan) const;
  // Starts a reservation thread (`Reserve(chunks)`); its outcome comes
  // through the future. Fails once the engine is closed.
  absl::StatusOr<std::future<absl::Status>> ScheduleReservation(size_t chunks)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until no reservation is pending, while no save is in flight (or
  // the engine closed): a save started after a reservation was asked for
  // stages into its memory. With saves in flight it returns at once: the
  // reservation runs only once they have drained.
  void AwaitReservations() ABSL_LOCKS_EXCLUDED(mu_);
  // A reservation thread: once no save is in flight, and holding
  // `staging_mu_` so no save starts meanwhile, grows the pool to `chunks`
  // pinned, or pins it where a save grew it unpinned. It holds nothing
  // while it waits for saves in flight.
  absl::Status Reserve(size_t chunks) ABSL_LOCKS_EXCLUDED(staging_mu_, mu_);
  std::vector<std::thread> TakeReservations() ABSL_LOCKS_EXCLUDED(mu_);

  // The first failure no handle reported, annotated; marks it reported.
  absl::Status TakeUnreportedError() ABSL_LOCKS_EXCLUDED(mu_);
  // Persister thread, after each save.
  void OnSaveDone(SaveJob& job, const absl::Status& outcome, const SaveStats& s)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Appends a save's metrics line, if there is a metrics log (persister
  // thread, or `Close` once the persister stopped); so does `LogSkipped`
  // for each of `skipped`.
  void AppendMetricsLine(const SaveStats& s, const absl::Status& outcome);
  void LogSkipped(const std::vector<SaveStats>& skipped);

  // The watchdog thread: watches the oldest save not given up yet.
  void Watch() ABSL_LOCKS_EXCLUDED(mu_);
  // Past a preemption deadline: gives up every save in flight that is not
  // committing (watchdog thread).
  void AbandonAtDeadline() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fails `job` with `error` now (its waiters wake, the persister drops it),
  // logs it, and queues it for the next SaveAsync or Close to report; false
  // when it is done, committing or given up already.
  bool GiveUp(const std::shared_ptr<SaveJob>& job, absl::Status error)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string root_;
  const EngineOptions options_;
  const std::shared_ptr<FileSystem> fs_;
  // ROOT/.ckpt-writer.lock, held from Open until Close has stopped every
  // thread that writes.
  std::unique_ptr<FileLock> writer_lock_;
  // A multi-rank engine's side of the commit (used by the persister thread,
  // and by `NewJob` for its nonce); null for a single process.
  const std::unique_ptr<RankCommitter> committer_;
  OpenedIo backend_;
  StagingPool pool_;
  MetricsSink metrics_;  // persister thread only
  std::unique_ptr<Persister> persister_;
  // Told each save's outcome by `OnSaveDone` and `Skip`; null without a tier.
  std::unique_ptr<BackgroundTier> tier_;
  std::unique_ptr<LazyStager> lazy_;
  // Copies eager saves' host tensors; null when lazy. Set by `Start`.
  std::unique_ptr<ParallelCopier> host_copier_ ABSL_PT_GUARDED_BY(staging_mu_);
  // Created on the first save with device tensors; used by the stager only
  // (under `staging_mu_`, or on the lazy stager's thread, which gets it with
  // each `StagingRequest`).
  std::unique_ptr<DeviceCopier> copier_ ABSL_GUARDED_BY(staging_mu_);
  std::thread watchdog_;

  // Serializes planning and staging, so saves stage and persist in order.
  Mutex staging_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool watchdog_stop_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<std::shared_ptr<SaveJob>> inflight_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<int64_t> steps_in_flight_ ABSL_GUARDED_BY(mu_);
  // Failed saves with their errors, until a handle or a later call reports them.
  std::deque<std::pair<std::shared_ptr<SaveJob>, absl::Status>> failed_ ABSL_GUARDED_BY(mu_);
  EngineStats stats_ ABSL_GUARDED_BY(mu_);
  // Skipped saves not in the metrics log yet: the persister thread writes
  // their lines after the next finished save's (or `Close` does), so that
  // the training thread, which skips them, does no file I/O.
  std::vector<SaveStats> skipped_unlogged_ ABSL_GUARDED_BY(mu_);
  absl::BitGen gen_ ABSL_GUARDED_BY(mu_);
  // Multi-rank: how many saves of each step this engine started (part of
  // the shared temp directory's name; every rank counts alike).
  absl::flat_hash_map<int64_t, int> attempts_ ABSL_GUARDED_BY(mu_);
  // Reservation threads, joined by `Close`, and how many have not finished.
  std::vector<std::thread> reservations_ ABSL_GUARDED_BY(mu_);
  int reservations_pending_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ckpt::internal

#endif  // CKPT_ENGINE_ENGINE_IMPL_H_
