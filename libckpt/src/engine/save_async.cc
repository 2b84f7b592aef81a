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
#include "engine/engine_impl.h"
#include "engine/save_job.h"
#include "engine/stager.h"
#include "format/manifest.h"
#include "format/names.h"
#include "format/shard_plan.h"
#include "util/log.h"
#include "util/status_macros.h"

namespace ckpt::internal {
namespace {

std::atomic<DeviceCopierFactory> device_copier_factory{nullptr};

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

}  // namespace

void SetDeviceCopierFactoryForTesting(DeviceCopierFactory factory) {
  device_copier_factory.store(factory);
}

absl::StatusOr<std::shared_ptr<SaveHandle>> EngineImpl::SaveAsync(
    int64_t step, std::span<const TensorView> tensors, absl::string_view extras_json) {
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
