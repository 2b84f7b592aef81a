// `EngineImpl::SaveAsync`: a save from the caller's tensors to a job the
// persister writes, staged on the caller's thread (eager) or handed to the
// lazy stager.
#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/container/flat_hash_set.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "distributed/rank_layout.h"
#include "engine/engine_impl.h"
#include "engine/save_job.h"
#include "engine/stager.h"
#include "format/manifest.h"
#include "format/names.h"
#include "format/shard_plan.h"
#include "preemption/preemption_state.h"
#include "util/log.h"
#include "util/status_macros.h"

namespace ckpt::internal {
namespace {

std::atomic<DeviceCopierFactory> device_copier_factory{nullptr};

// The checks on its arguments that `Engine::SaveAsync` documents.
// Where a `kSharded` view says it lies: one offset and global dimension per
// dimension of its own, the chunk inside the global tensor; in a
// single-process engine, the whole of it.
absl::Status ValidateChunkPlace(const TensorView& t, const std::string& where, bool multi_rank) {
  if (t.global_shape.size() != t.shape.size() || t.global_offset.size() != t.shape.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": a sharded chunk of rank ", t.shape.size(), " needs a global_shape and a global_offset of ",
        t.shape.size(), " entries (has ", t.global_shape.size(), " and ", t.global_offset.size(), ")"));
  }
  CKPT_RETURN_IF_ERROR(Annotate(TensorBytes(t.dtype, t.global_shape).status(),
                                absl::StrCat(where, ": global_shape")));
  for (size_t d = 0; d < t.shape.size(); ++d) {
    if (t.global_offset[d] < 0 || t.global_offset[d] > t.global_shape[d] ||
        t.shape[d] > t.global_shape[d] - t.global_offset[d]) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": the chunk [", t.global_offset[d], ", +", t.shape[d], ") of dimension ", d,
          " lies outside the global tensor's ", t.global_shape[d]));
    }
  }
  if (!multi_rank && t.shape != t.global_shape) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": a single-process save holds no part of a global tensor (chunk shape [",
        absl::StrJoin(t.shape, ", "), "] of [", absl::StrJoin(t.global_shape, ", "),
        "]); open the engine with EngineOptions::distributed, or pass the whole tensor"));
  }
  return absl::OkStatus();
}

absl::Status ValidateSave(int64_t step, std::span<const TensorView> tensors,
                          absl::string_view extras_json, bool multi_rank) {
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
    if (t.placement == TensorPlacement::kSharded) {
      CKPT_RETURN_IF_ERROR(ValidateChunkPlace(t, where, multi_rank));
    }
  }
  auto extras = nlohmann::json::parse(extras_json.begin(), extras_json.end(), nullptr,
                                      /*allow_exceptions=*/false);
  if (extras.is_discarded() || !extras.is_object()) {
    return absl::InvalidArgumentError("extras must be a JSON object (valid UTF-8)");
  }
  return absl::OkStatus();
}

// Marks the streams of `tensors`' device tensors with `copier`: the point
// the save's copies are ordered after (now, on the caller's thread).
absl::StatusOr<std::unique_ptr<CallerStreamMark>> MarkCallerStreams(
    DeviceCopier& copier, std::span<const TensorView> tensors) {
  std::vector<DeviceStream> streams;
  for (const TensorView& t : tensors) {
    const DeviceStream ds{t.device_index, t.stream};
    if (t.device != TensorView::Device::kCpu &&
        std::find(streams.begin(), streams.end(), ds) == streams.end()) {
      streams.push_back(ds);
    }
  }
  return copier.MarkCallerStreams(streams);
}

}  // namespace

void SetDeviceCopierFactoryForTesting(DeviceCopierFactory factory) {
  device_copier_factory.store(factory);
}

// The steps, in order. Validation and an earlier failure need no lock; the
// rest runs under `staging_mu_`, so saves are planned, queued and staged in
// the order they were started.
absl::StatusOr<std::shared_ptr<SaveHandle>> EngineImpl::SaveAsync(
    int64_t step, std::span<const TensorView> tensors, absl::string_view extras_json) {
  const CallerClock clock;
  CKPT_RETURN_IF_ERROR(ValidateSave(step, tensors, extras_json, committer_ != nullptr));
  CKPT_RETURN_IF_ERROR(TakeUnreportedError());
  // A rank of a multi-rank save writes its own tensors and the replicated
  // ones it owns; the other ranks write the rest of the replicated ones.
  std::vector<TensorView> own;
  uint64_t replicated_fingerprint = 0;
  if (committer_ != nullptr) {
    own = TensorsThisRankWrites(tensors);
    replicated_fingerprint = ReplicatedFingerprint(tensors);
    tensors = own;
  }
  AwaitReservations();
  MutexLock staging_lock(&staging_mu_);
  CKPT_RETURN_IF_ERROR(AdmitStep(step));
  std::vector<PlannedShard> plan =
      PlanShards(tensors, options_.shard_min_bytes, options_.shard_max_bytes);
  if (committer_ != nullptr) {
    for (PlannedShard& shard : plan) shard.file = RankFilePrefix(committer_->rank()) + shard.file;
  }
  const size_t needed = StagingChunksFor(plan);
  const size_t in_flight = SavesInFlight();
  CKPT_RETURN_IF_ERROR(SizePoolForSave(step, needed, in_flight).status());
  StagingRequest staging;
  CKPT_ASSIGN_OR_RETURN(staging.device, DeviceCopierFor(tensors));
  if (staging.device != nullptr) {
    CKPT_ASSIGN_OR_RETURN(staging.mark, MarkCallerStreams(*staging.device, tensors));
  }
  std::shared_ptr<SaveJob> job = NewJob(step, tensors, extras_json, std::move(plan),
                                        clock.start(), /*has_device=*/staging.device != nullptr);
  job->replicated_fingerprint = replicated_fingerprint;
  if (ShouldSkip(needed, in_flight)) {
    Skip(*job, clock);
    return job;
  }
  TrackInFlight(job);
  persister_->Enqueue(job);
  staging.job = job;
  Stage(std::move(staging), clock);
  return job;
}

std::vector<TensorView> EngineImpl::TensorsThisRankWrites(std::span<const TensorView> tensors) const {
  if (committer_ == nullptr) return std::vector<TensorView>(tensors.begin(), tensors.end());
  const std::vector<int> owners = TensorOwners(tensors, committer_->rank(), committer_->world_size());
  std::vector<TensorView> own;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (owners[i] == committer_->rank()) own.push_back(tensors[i]);
  }
  return own;
}

absl::Status EngineImpl::AdmitStep(int64_t step) {
  {
    MutexLock lock(&mu_);
    if (closed_) return absl::FailedPreconditionError(absl::StrCat("engine for ", root_, " is closed"));
    if (steps_in_flight_.contains(step)) {
      return absl::AlreadyExistsError(absl::StrCat("step ", step, " is already being saved"));
    }
  }
  if (PreemptionDeadlinePassed()) {
    return absl::DeadlineExceededError(absl::StrCat(
        "save of step ", step, " in ", root_, " refused: ", PreemptionGraceRanOut(), " (ckpt/preemption.h)"));
  }
  auto existing = fs_->Stat(JoinPath(root_, CheckpointDirName(step)));
  if (existing.ok()) {
    return absl::AlreadyExistsError(
        absl::StrCat("checkpoint for step ", step, " already exists in ", root_));
  }
  if (existing.status().code() != absl::StatusCode::kNotFound) return existing.status();
  return absl::OkStatus();
}

size_t EngineImpl::SavesInFlight() const {
  MutexLock lock(&mu_);
  return inflight_.size();
}

absl::StatusOr<DeviceCopier*> EngineImpl::DeviceCopierFor(std::span<const TensorView> tensors) {
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
    return copier_.get();
  }
  return nullptr;
}

std::shared_ptr<SaveJob> EngineImpl::NewJob(int64_t step, std::span<const TensorView> tensors,
                                            absl::string_view extras_json,
                                            std::vector<PlannedShard> plan,
                                            Clock::time_point start, bool has_device) {
  // An eager save of host tensors keeps its caller blocked while it copies;
  // writing meanwhile would only slow that copy down (the CPU and memory
  // bandwidth are shared) to gain the copy's few hundred milliseconds.
  const bool defer_writes =
      lazy_ == nullptr && !has_device && !options_.write_during_eager_staging;
  std::string temp_name;
  if (committer_ != nullptr) {
    int attempt;
    {
      MutexLock lock(&mu_);
      attempt = ++attempts_[step];
    }
    temp_name = MultiRankTempDirName(step, committer_->nonce(), attempt);
  } else {
    temp_name = TempDirName(step, NextNonce());
  }
  return std::make_shared<SaveJob>(
      step, std::string(extras_json), std::vector<TensorView>(tensors.begin(), tensors.end()),
      std::move(plan), CheckpointDirName(step), JoinPath(root_, temp_name), start, defer_writes);
}

bool EngineImpl::ShouldSkip(size_t needed, size_t in_flight) const {
  return options_.when_busy == EngineOptions::BusyPolicy::kSkip && in_flight > 0 &&
         pool_.free_count() < needed;
}

void EngineImpl::Skip(SaveJob& job, const CallerClock& clock) {
  SaveStats stats;
  stats.step = job.step();
  stats.blocked_s = clock.seconds();
  stats.blocked_cpu_s = clock.cpu_seconds();
  stats.backend = backend_.description;
  stats.skipped = true;
  job.MarkSkipped(stats);
  MutexLock lock(&mu_);
  ++stats_.saves_started;
  ++stats_.saves_skipped;
  stats_.last = stats;
  if (metrics_.has_jsonl()) skipped_unlogged_.push_back(stats);
  Log(LogLevel::kInfo, absl::StrCat("skipped save of step ", job.step(), ": staging memory busy"));
  if (tier_ != nullptr) {
    tier_->Skip(job.step(), absl::UnavailableError("the save was skipped: staging memory busy"));
  }
}

void EngineImpl::TrackInFlight(const std::shared_ptr<SaveJob>& job) {
  MutexLock lock(&mu_);
  ++stats_.saves_started;
  inflight_.push_back(job);
  steps_in_flight_.insert(job->step());
  AddProcessSavesInFlight(1);
}

void EngineImpl::Stage(StagingRequest request, const CallerClock& clock) {
  if (lazy_ != nullptr) {
    lazy_->Enqueue(std::move(request), clock.seconds(), clock.cpu_seconds());
    return;
  }
  // A staging failure (the persister failed meanwhile, or the engine is
  // closing) is reported by the handle, with the persister's reason.
  const std::shared_ptr<SaveJob> job = request.job;
  StagingReport staged = StageJob(std::move(request), pool_, host_copier_.get());
  staged.blocked_s = clock.seconds();
  staged.blocked_cpu_s = clock.cpu_seconds();
  job->FinishStaging(std::move(staged));
}

absl::StatusOr<SaveStats> EngineImpl::Save(int64_t step, std::span<const TensorView> tensors,
                                           absl::string_view extras_json) {
  CKPT_ASSIGN_OR_RETURN(std::shared_ptr<SaveHandle> handle, SaveAsync(step, tensors, extras_json));
  CKPT_RETURN_IF_ERROR(handle->Wait());
  return handle->stats();
}

uint64_t EngineImpl::NextNonce() {
  MutexLock lock(&mu_);
  return absl::Uniform<uint64_t>(gen_);
}

}  // namespace ckpt::internal
