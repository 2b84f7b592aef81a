// `Engine`: validates saves, stages them (on the caller's thread, or on a
// background thread in lazy mode), and hands them to the persister.
#include "ckpt/engine.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <future>
#include <thread>

#include <nlohmann/json.hpp>

#include "absl/container/flat_hash_set.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "ckpt/root_lock.h"
#include "util/mutex.h"
#include "engine/metrics.h"
#include "engine/persister.h"
#include "engine/save_job.h"
#include "engine/stager.h"
#include "format/manifest.h"
#include "format/names.h"
#include "format/shard_plan.h"
#include "io/backend.h"
#include "io/small_file.h"
#include "staging/staging_pool.h"
#include "util/background_thread.h"
#include "util/log.h"
#include "util/status_macros.h"

namespace ckpt {
namespace {

using namespace internal;  // NOLINT: the engine is the glue of the internals

std::atomic<DeviceCopierFactory> device_copier_factory{nullptr};

constexpr char kWriter[] = "ckpt 0.1.0";

absl::Status ValidateSave(int64_t step, std::span<const TensorView> tensors,
                          absl::string_view extras_json) {
  if (step < 0) return absl::InvalidArgumentError(absl::StrCat("step ", step, " is negative"));
  absl::flat_hash_set<absl::string_view> names;
  names.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorView& t = tensors[i];
    absl::Status name_ok = ValidateTensorName(t.name);
    if (!name_ok.ok()) return Annotate(name_ok, absl::StrCat("tensor #", i));
    const std::string where = absl::StrCat("tensor \"", t.name, "\"");
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(absl::StrCat(where, " is given twice"));
    }
    if (!IsValidDType(t.dtype)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": unknown dtype ", static_cast<int>(t.dtype)));
    }
    if (t.shape.size() > kMaxRank) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": rank ", t.shape.size(), " > ", kMaxRank));
    }
    auto bytes = TensorBytes(t.dtype, t.shape);
    if (!bytes.ok()) return Annotate(bytes.status(), where);
    if (*bytes != t.nbytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": shape holds ", *bytes / DTypeSize(t.dtype), " ", DTypeName(t.dtype),
          " elements but nbytes is ", t.nbytes));
    }
    if (t.nbytes > 0 && t.data == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": data is null"));
    }
    if (t.device != TensorView::Device::kCpu && t.device != TensorView::Device::kCuda) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": unknown device"));
    }
  }
  auto extras = nlohmann::json::parse(extras_json.begin(), extras_json.end(), nullptr,
                                      /*allow_exceptions=*/false);
  if (extras.is_discarded() || !extras.is_object()) {
    return absl::InvalidArgumentError("extras must be a JSON object (valid UTF-8)");
  }
  return absl::OkStatus();
}

// Removes the temp directories of saves that a dead writer left in `root`
// (REQUIRES: the writer lock is held). Compactions' temp directories
// (`.tmp-compact-*`) belong to retention jobs, which run beside the writer,
// and stay. A directory that cannot be removed is only logged.
absl::Status RemoveAbandonedSaves(FileSystem& fs, const std::string& root) {
  CKPT_ASSIGN_OR_RETURN(std::vector<std::string> names, fs.ListDir(root));
  const std::string prefix = absl::StrCat(kTempPrefix, "step-");
  for (const std::string& name : names) {
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string path = JoinPath(root, name);
    RemoveTreeBestEffort(fs, path);
    if (fs.Stat(path).ok()) {
      Log(LogLevel::kWarning, absl::StrCat("could not remove abandoned save ", path));
    } else {
      Log(LogLevel::kInfo, absl::StrCat("removed ", path, ", a save its writer did not finish"));
    }
  }
  return absl::OkStatus();
}

size_t ChunksNeeded(const std::vector<PlannedShard>& plan, size_t chunk_bytes) {
  size_t n = 0;
  for (const PlannedShard& s : plan) n += (s.padded_bytes + chunk_bytes - 1) / chunk_bytes;
  return n;
}

// Runs `StageJob` for lazily staged saves, in order, on its own thread.
class LazyStager {
 public:
  explicit LazyStager(StagingPool* pool) : pool_(pool), thread_([this] { Run(); }) {}
  ~LazyStager() { Stop(); }
  // `blocked_s` and `blocked_cpu_s`: how long `SaveAsync` held its caller.
  void Enqueue(StagingRequest request, double blocked_s, double blocked_cpu_s) {
    MutexLock lock(&mu_);
    jobs_.push_back(Queued{std::move(request), blocked_s, blocked_cpu_s});
  }
  void Stop() {
    {
      MutexLock lock(&mu_);
      stopping_ = true;
    }
    if (thread_.joinable()) thread_.join();
  }

 private:
  void Run() {
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

  struct Queued {
    StagingRequest request;
    double blocked_s = 0;
    double blocked_cpu_s = 0;
  };

  StagingPool* const pool_;
  Mutex mu_;
  std::deque<Queued> jobs_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

class EngineImpl final : public Engine {
 public:
  EngineImpl(std::string root, EngineOptions options, std::shared_ptr<FileSystem> fs,
             std::unique_ptr<FileLock> writer_lock, internal::OpenedIo backend)
      : root_(std::move(root)),
        options_(std::move(options)),
        fs_(std::move(fs)),
        writer_lock_(std::move(writer_lock)),
        backend_(std::move(backend)),
        pool_(options_.io.chunk_bytes),
        metrics_(fs_.get(), backend_.queue.get(), options_.metrics_jsonl_path,
                 options_.prometheus_textfile_path) {}

  absl::Status Start() {
    if (options_.staging_bytes > 0) {
      const size_t chunks = std::max<size_t>(
          2, (options_.staging_bytes + options_.io.chunk_bytes - 1) / options_.io.chunk_bytes);
      CKPT_RETURN_IF_ERROR(pool_.Resize(chunks, backend_.queue.get()));
    }
    PersisterContext ctx{fs_.get(),        backend_.queue.get(),
                         &pool_,           root_,
                         backend_.direct,  backend_.description,
                         kWriter,          options_.compression_level,
                         options_.delta,   options_.io.encode_buffers,
                         BackgroundNice()};
    persister_ = std::make_unique<Persister>(ctx, [this](SaveJob& job, const absl::Status& outcome, const SaveStats& s) {
                                 OnSaveDone(job, outcome, s);
                               });
    if (options_.lazy_staging) {
      lazy_ = std::make_unique<LazyStager>(&pool_);
    } else {
      host_copier_ = std::make_unique<ParallelCopier>(
          options_.staging_threads > 0 ? options_.staging_threads : ParallelCopier::DefaultThreads());
    }
    if (options_.watchdog_timeout > absl::ZeroDuration() ||
        options_.stall_timeout > absl::ZeroDuration()) {
      watchdog_ = std::thread([this] {
        BecomeBackgroundThread("ckpt-watchdog", 0);
        Watch();
      });
    }
    return absl::OkStatus();
  }

  ~EngineImpl() override {
    absl::Status s = Close(CloseMode::kWait);
    if (!s.ok()) {
      Log(LogLevel::kError, absl::StrCat("engine for ", root_,
                                         " destroyed with an unreported save error: ", s.message()));
    }
  }

  absl::StatusOr<std::shared_ptr<SaveHandle>> SaveAsync(int64_t step,
                                                        std::span<const TensorView> tensors,
                                                        absl::string_view extras_json) override {
    const Clock::time_point start = Clock::now();
    const double start_cpu = ThreadCpuSeconds();
    CKPT_RETURN_IF_ERROR(ValidateSave(step, tensors, extras_json));
    CKPT_RETURN_IF_ERROR(TakeUnreportedError());
    MutexLock staging_lock(&staging_mu_);
    {
      MutexLock lock(&mu_);
      if (closed_) return absl::FailedPreconditionError(absl::StrCat("engine for ", root_, " is closed"));
      if (steps_in_flight_.contains(step)) {
        return absl::AlreadyExistsError(absl::StrCat("step ", step, " is already being saved"));
      }
    }
    const std::string final_name = CheckpointDirName(step);
    auto existing = fs_->Stat(JoinPath(root_, final_name));
    if (existing.ok()) {
      return absl::AlreadyExistsError(
          absl::StrCat("checkpoint for step ", step, " already exists in ", root_));
    }
    if (existing.status().code() != absl::StatusCode::kNotFound) return existing.status();

    std::vector<PlannedShard> plan =
        PlanShards(tensors, options_.shard_min_bytes, options_.shard_max_bytes);
    const size_t needed = StagingChunksFor(plan);
    size_t in_flight;
    {
      MutexLock lock(&mu_);
      in_flight = inflight_.size();
    }
    if (in_flight == 0 && (pool_.count() < 2 || (options_.staging_bytes == 0 && pool_.count() < needed))) {
      CKPT_RETURN_IF_ERROR(pool_.Resize(std::max<size_t>(needed, 2), backend_.queue.get()));
    }
    StagingRequest staging;
    for (const TensorView& t : tensors) {
      if (t.device == TensorView::Device::kCpu) continue;
      if (copier_ == nullptr) {
        DeviceCopierFactory factory = device_copier_factory.load();
        auto copier = factory != nullptr ? factory() : NewCudaCopier();
        if (!copier.ok()) {
          return absl::FailedPreconditionError(absl::StrCat(
              "tensor \"", t.name, "\" is in CUDA memory, but no CUDA device can be used: ",
              copier.status().message()));
        }
        copier_ = std::move(*copier);
      }
      staging.device = copier_.get();
      break;
    }
    if (staging.device != nullptr) {
      // The point the save's copies are ordered after: now, on this thread.
      std::vector<DeviceStream> streams;
      for (const TensorView& t : tensors) {
        const DeviceStream ds{t.device_index, t.stream};
        if (t.device != TensorView::Device::kCpu &&
            std::find(streams.begin(), streams.end(), ds) == streams.end()) {
          streams.push_back(ds);
        }
      }
      CKPT_ASSIGN_OR_RETURN(staging.mark, staging.device->MarkCallerStreams(streams));
    }
    // An eager save of host tensors keeps its caller blocked while it copies;
    // writing meanwhile would only slow that copy down (the CPU and memory
    // bandwidth are shared) to gain the copy's few hundred milliseconds.
    const bool defer_writes =
        lazy_ == nullptr && staging.device == nullptr && !options_.write_during_eager_staging;
    auto job = std::make_shared<SaveJob>(
        step, std::string(extras_json), std::vector<TensorView>(tensors.begin(), tensors.end()),
        std::move(plan), final_name, JoinPath(root_, TempDirName(step, NextNonce())), start,
        defer_writes);
    if (options_.when_busy == EngineOptions::BusyPolicy::kSkip && in_flight > 0 &&
        pool_.free_count() < needed) {
      SaveStats stats;
      stats.step = step;
      stats.blocked_s = SecondsSince(start);
      stats.blocked_cpu_s = ThreadCpuSeconds() - start_cpu;
      stats.backend = backend_.description;
      job->MarkSkipped(stats);
      MutexLock lock(&mu_);
      ++stats_.saves_started;
      ++stats_.saves_skipped;
      stats_.last = stats;
      Log(LogLevel::kInfo, absl::StrCat("skipped save of step ", step, ": staging memory busy"));
      return job;
    }
    {
      MutexLock lock(&mu_);
      ++stats_.saves_started;
      inflight_.push_back(job);
      steps_in_flight_.insert(step);
    }
    persister_->Enqueue(job);
    staging.job = job;
    if (lazy_ != nullptr) {
      lazy_->Enqueue(std::move(staging), SecondsSince(start), ThreadCpuSeconds() - start_cpu);
      return job;
    }
    // A staging failure (the persister failed meanwhile, or the engine is
    // closing) is reported by the handle, with the persister's reason.
    StagingReport staged = StageJob(std::move(staging), pool_, host_copier_.get());
    staged.blocked_s = SecondsSince(start);
    staged.blocked_cpu_s = ThreadCpuSeconds() - start_cpu;
    job->FinishStaging(std::move(staged));
    return job;
  }

  absl::Status ReserveStaging(std::span<const TensorView> tensors, bool wait) override {
    if (options_.staging_bytes > 0) return absl::OkStatus();  // fixed at Open
    const size_t needed = StagingChunksFor(
        PlanShards(tensors, options_.shard_min_bytes, options_.shard_max_bytes));
    auto reservation = std::make_shared<std::promise<absl::Status>>();
    std::future<absl::Status> outcome = reservation->get_future();
    {
      MutexLock lock(&mu_);
      if (closed_) return absl::FailedPreconditionError(absl::StrCat("engine for ", root_, " is closed"));
      reservations_.emplace_back([this, needed, reservation] {
        BecomeBackgroundThread("ckpt-reserve", BackgroundNice());
        reservation->set_value(Reserve(needed));
      });
    }
    if (!wait) return absl::OkStatus();
    return outcome.get();
  }

  absl::StatusOr<SaveStats> Save(int64_t step, std::span<const TensorView> tensors,
                                 absl::string_view extras_json) override {
    CKPT_ASSIGN_OR_RETURN(std::shared_ptr<SaveHandle> handle, SaveAsync(step, tensors, extras_json));
    CKPT_RETURN_IF_ERROR(handle->Wait());
    return handle->stats();
  }

  absl::Status Close(CloseMode mode) override {
    {
      MutexLock lock(&mu_);
      if (closed_) return absl::OkStatus();
      closed_ = true;
      if (mode == CloseMode::kCancel) {
        for (auto& job : inflight_) job->Abort(absl::CancelledError("save cancelled: engine closing"));
      }
    }
    if (mode == CloseMode::kCancel) pool_.Cancel();
    if (lazy_ != nullptr) lazy_->Stop();
    for (std::thread& t : TakeReservations()) t.join();
    MutexLock staging_lock(&staging_mu_);  // no save is staging past this point
    persister_->Stop(mode == CloseMode::kCancel);
    {
      MutexLock lock(&mu_);
      watchdog_stop_ = true;
    }
    if (watchdog_.joinable()) watchdog_.join();
    writer_lock_.reset();  // nothing of this engine writes any more: another may open ROOT
    return TakeUnreportedError();
  }

  EngineStats stats() const override {
    MutexLock lock(&mu_);
    EngineStats s = stats_;
    s.saves_in_flight = inflight_.size();
    s.staging_bytes = pool_.count() * pool_.chunk_bytes();
    s.staging_bytes_free = pool_.free_count() * pool_.chunk_bytes();
    s.staging_memory = PinKindName(pool_.pin_kind());
    return s;
  }

  const std::string& root() const override { return root_; }
  absl::string_view backend() const override { return backend_.description; }

 private:
  // `EngineOptions::background_nice`, with -1 resolved.
  int BackgroundNice() const {
    if (options_.background_nice >= 0) return options_.background_nice;
    const bool encodes =
        options_.delta.mode != DeltaOptions::Mode::kNone || options_.compression_level > 0;
    return encodes ? 10 : 0;
  }

  uint64_t NextNonce() {
    MutexLock lock(&mu_);
    return absl::Uniform<uint64_t>(gen_);
  }

  // Staging chunks a save of `plan` needs. Deltas hold a record's chunks
  // until it is complete: two spare chunks let a record straddle chunk
  // boundaries without starving the stager.
  size_t StagingChunksFor(const std::vector<PlannedShard>& plan) const {
    return ChunksNeeded(plan, pool_.chunk_bytes()) +
           (options_.delta.mode != DeltaOptions::Mode::kNone ? 2 : 0);
  }

  // A reservation thread: grows the pool to `chunks` once no save is in
  // flight, holding `staging_mu_` so no save starts meanwhile.
  absl::Status Reserve(size_t chunks) {
    MutexLock staging_lock(&staging_mu_);
    {
      MutexLock lock(&mu_);
      mu_.Await([this] { return closed_ || inflight_.empty(); });
      if (closed_) return absl::CancelledError("engine closed before staging memory was reserved");
    }
    if (pool_.count() >= chunks) return absl::OkStatus();
    const Clock::time_point start = Clock::now();
    absl::Status s = pool_.Resize(chunks, backend_.queue.get());
    if (!s.ok()) {
      Log(LogLevel::kWarning, absl::StrCat("reserving staging memory for ", root_, ": ", s.message()));
      return s;
    }
    Log(LogLevel::kInfo, absl::StrCat("reserved ", chunks * pool_.chunk_bytes(), " bytes of staging memory in ",
                                      SecondsSince(start), " s"));
    return absl::OkStatus();
  }

  // The first failure no handle reported, annotated; marks it reported.
  absl::Status TakeUnreportedError() {
    MutexLock lock(&mu_);
    while (!failed_.empty()) {
      auto [job, error] = std::move(failed_.front());
      failed_.pop_front();
      if (job->Done() && job->error_reported()) continue;
      job->MarkErrorReported();
      return absl::Status(error.code(), absl::StrCat("an earlier save failed: ", error.message()));
    }
    return absl::OkStatus();
  }

  std::vector<std::thread> TakeReservations() {
    MutexLock lock(&mu_);
    return std::move(reservations_);
  }

  // Persister thread, after each save.
  void OnSaveDone(SaveJob& job, const absl::Status& outcome, const SaveStats& s) {
    EngineStats snapshot;
    {
      MutexLock lock(&mu_);
      auto it = std::find_if(inflight_.begin(), inflight_.end(),
                             [&](const auto& j) { return j.get() == &job; });
      std::shared_ptr<SaveJob> owned;
      if (it != inflight_.end()) {
        owned = *it;
        inflight_.erase(it);
      }
      steps_in_flight_.erase(job.step());
      if (outcome.ok()) {
        ++stats_.saves_committed;
        stats_.bytes_committed += s.file_bytes;
      } else {
        ++stats_.saves_failed;
        // A save the watchdog gave up was queued for reporting then.
        if (owned != nullptr && !job.expired()) failed_.emplace_back(owned, outcome);
      }
      stats_.last = s;
      snapshot = stats_;
      snapshot.saves_in_flight = inflight_.size();
    }
    snapshot.staging_bytes = pool_.count() * pool_.chunk_bytes();
    if (!outcome.ok()) Log(LogLevel::kError, outcome.message());
    if (metrics_.has_jsonl()) {
      absl::Status m = metrics_.AppendJsonLine(SaveStatsJson(s, outcome));
      if (!m.ok()) Log(LogLevel::kWarning, absl::StrCat("metrics log: ", m.message()));
    }
    if (metrics_.has_prometheus()) {
      absl::Status m = metrics_.WritePrometheus(PrometheusText(snapshot, root_));
      if (!m.ok()) Log(LogLevel::kWarning, absl::StrCat("prometheus textfile: ", m.message()));
    }
  }

  // Watches the oldest save not given up yet: warns once after
  // `watchdog_timeout` without progress, gives it up after `stall_timeout`.
  void Watch() {
    const absl::Duration warn_after = options_.watchdog_timeout;
    const absl::Duration give_up_after = options_.stall_timeout;
    absl::Duration shortest = absl::InfiniteDuration();
    if (warn_after > absl::ZeroDuration()) shortest = warn_after;
    if (give_up_after > absl::ZeroDuration()) shortest = std::min(shortest, give_up_after);
    const absl::Duration period =
        std::clamp(shortest / 4, absl::Milliseconds(10), absl::Seconds(1));
    MutexLock lock(&mu_);
    while (!watchdog_stop_) {
      mu_.AwaitWithTimeout([this] { return watchdog_stop_; }, period);
      if (watchdog_stop_) continue;
      auto live = std::find_if(inflight_.begin(), inflight_.end(),
                               [](const auto& j) { return !j->expired(); });
      if (live == inflight_.end()) continue;
      std::shared_ptr<SaveJob> job = *live;
      const absl::Duration idle = absl::FromChrono(job->since_progress());
      const char* stage = SaveStageName(job->stage.load());
      if (give_up_after > absl::ZeroDuration() && idle >= give_up_after) {
        absl::Status error = absl::DeadlineExceededError(absl::StrCat(
            "save of step ", job->step(), " in ", root_, " made no progress for ",
            absl::FormatDuration(idle), " while in stage ", stage,
            " (stall_timeout); given up, nothing committed"));
        if (job->Expire(error)) {
          ++stats_.saves_given_up;
          failed_.emplace_back(job, error);
          Log(LogLevel::kError, error.message());
          pool_.WakeWaiters();  // a stager waiting for staging memory stops
          continue;
        }
      }
      if (warn_after <= absl::ZeroDuration() || idle < warn_after ||
          job->stall_reported.exchange(true)) {
        continue;
      }
      ++stats_.watchdog_stalls;
      Log(LogLevel::kWarning, absl::StrCat("watchdog: save of step ", job->step(), " in ", root_,
                                           " made no progress for ", absl::FormatDuration(idle),
                                           " (stage: ", stage, ")"));
      if (options_.on_stall) {
        mu_.Unlock();
        options_.on_stall(job->step(), idle);
        mu_.Lock();
      }
    }
  }

  const std::string root_;
  const EngineOptions options_;
  const std::shared_ptr<FileSystem> fs_;
  // ROOT/.ckpt-writer.lock, held from Open until Close has stopped every
  // thread that writes.
  std::unique_ptr<FileLock> writer_lock_;
  internal::OpenedIo backend_;
  StagingPool pool_;
  MetricsSink metrics_;  // persister thread only
  std::unique_ptr<Persister> persister_;
  std::unique_ptr<LazyStager> lazy_;
  // Copies eager saves' host tensors (under `staging_mu_`); null when lazy.
  std::unique_ptr<ParallelCopier> host_copier_;
  // Created on the first save with device tensors; used by the stager only
  // (under `staging_mu_`, or on the lazy stager's thread).
  std::unique_ptr<DeviceCopier> copier_;
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
  absl::BitGen gen_ ABSL_GUARDED_BY(mu_);
  // Threads of `ReserveStaging`, joined by `Close`.
  std::vector<std::thread> reservations_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

namespace internal {
void SetDeviceCopierFactoryForTesting(DeviceCopierFactory factory) {
  device_copier_factory.store(factory);
}
}  // namespace internal

absl::StatusOr<std::unique_ptr<Engine>> Engine::Open(const std::string& root,
                                                     const EngineOptions& options) {
  if (root.empty()) return absl::InvalidArgumentError("checkpoint root is empty");
  std::shared_ptr<FileSystem> fs = options.fs != nullptr ? options.fs : PosixFileSystem();
  if (options.shard_min_bytes > options.shard_max_bytes) {
    return absl::InvalidArgumentError("shard_min_bytes is larger than shard_max_bytes");
  }
  if (options.delta.mode == DeltaOptions::Mode::kTopK &&
      !(options.delta.topk_ratio > 0 && options.delta.topk_ratio <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("delta.topk_ratio ", options.delta.topk_ratio, " is not in (0, 1]"));
  }
  if (options.delta.full_every < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("delta.full_every ", options.delta.full_every, " must be at least 1"));
  }
  if (options.staging_threads < 0 || options.staging_threads > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("staging_threads ", options.staging_threads, " is not in 0..64"));
  }
  if (options.background_nice < -1 || options.background_nice > 19) {
    return absl::InvalidArgumentError(absl::StrCat(
        "background_nice ", options.background_nice, " is not in 0..19 (or -1: automatic)"));
  }
  if (options.io.encode_buffers < 1) {
    return absl::InvalidArgumentError("io.encode_buffers must be at least 1");
  }
  if (options.compression_level < 0 || options.compression_level > 19) {
    return absl::InvalidArgumentError(
        absl::StrCat("compression_level ", options.compression_level, " is not in 0..19"));
  }
  auto stat = fs->Stat(root);
  if (!stat.ok() && stat.status().code() == absl::StatusCode::kNotFound && options.create_root) {
    CKPT_RETURN_IF_ERROR(fs->CreateDir(root));
    size_t slash = root.find_last_of('/');
    std::string parent = slash == std::string::npos ? "." : slash == 0 ? "/" : root.substr(0, slash);
    CKPT_RETURN_IF_ERROR(fs->SyncDir(parent));
    stat = fs->Stat(root);
  }
  if (!stat.ok()) return Annotate(stat.status(), "checkpoint root");
  if (!stat->is_directory) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint root ", root, " is not a directory"));
  }
  // One writer per root: a second engine, here or in another process, would
  // race this one's commits, LATEST and delta base.
  auto writer_lock = LockRoot(root, RootLockKind::kWriter, "ckpt engine", fs.get());
  if (!writer_lock.ok()) {
    if (writer_lock.status().code() != absl::StatusCode::kUnavailable) return writer_lock.status();
    return absl::UnavailableError(absl::StrCat(
        writer_lock.status().message(), " (one engine writes a root at a time: close the other first)"));
  }
  // Holding the lock, every save in progress in ROOT is ours: a
  // `.tmp-step-*` directory there was left by a writer that died mid-save.
  CKPT_RETURN_IF_ERROR(RemoveAbandonedSaves(*fs, root));
  auto backend = OpenIo(*fs, options.io, root);
  if (!backend.ok()) return Annotate(backend.status(), absl::StrCat("checkpoint root ", root));
  auto engine = std::make_unique<EngineImpl>(root, options, std::move(fs), std::move(*writer_lock),
                                             std::move(*backend));
  CKPT_RETURN_IF_ERROR(engine->Start());
  return std::unique_ptr<Engine>(std::move(engine));
}

}  // namespace ckpt
