#include "engine_class.h"

#include <algorithm>
#include <span>
#include <type_traits>
#include <utility>

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "ckpt/json.h"
#include "tensor_convert.h"
#include "torch_status.h"

namespace ckpt::torch_ext {

EngineOptions ParseEngineOptions(const std::string& options_json) {
  EngineOptions options;
  const absl::Status parsed = ApplyEngineOptionsJson(options_json, &options);
  TORCH_CHECK_VALUE(parsed.ok(), "ckpt: ", parsed.message());
  return options;
}

SaveHandleHolder::SaveHandleHolder(std::shared_ptr<SaveHandle> handle,
                                   std::vector<at::Tensor> inputs)
    : handle_(std::move(handle)), inputs_(std::move(inputs)) {}

SaveHandleHolder::~SaveHandleHolder() {
  // The library may still be reading the inputs (lazy staging, device
  // copies): wait for that before they can be freed. Its error, if any,
  // stays with the save and surfaces through the engine.
  bool held;
  {
    std::lock_guard<std::mutex> lock(mu_);
    held = !inputs_.empty();
  }
  if (held) (void)handle_->WaitStaged();
}

void SaveHandleHolder::ReleaseInputs() {
  std::vector<at::Tensor> dropped;
  std::lock_guard<std::mutex> lock(mu_);
  dropped.swap(inputs_);
}

void SaveHandleHolder::WaitStaged() {
  absl::Status status = handle_->WaitStaged();
  ReleaseInputs();  // staged or failed: the library no longer reads them
  ThrowIfSaveFailed(status, "ckpt: ");  // the library's message names the step
}

void SaveHandleHolder::Wait() {
  absl::Status status = handle_->Wait();
  ReleaseInputs();
  ThrowIfSaveFailed(status, "ckpt: ");
}

bool SaveHandleHolder::Done() {
  const bool done = handle_->Done();
  if (done) ReleaseInputs();
  return done;
}

std::string SaveHandleHolder::StatsJson() const { return SaveStatsJson(handle_->stats()); }

EngineHolder::EngineHolder(const std::string& root, const std::string& options_json)
    : EngineHolder(root, ParseEngineOptions(options_json)) {}

EngineHolder::EngineHolder(const std::string& root, const EngineOptions& options) {
  lazy_ = options.lazy_staging;
  if (options.distributed.world_size > 1) {
    rank_ = options.distributed.rank;
    world_size_ = options.distributed.world_size;
  }
  auto engine = Engine::Open(root, options);
  ThrowIfError(engine.status(), world_size_ > 1 ? absl::StrCat("ckpt: open ", root, " (rank ", rank_,
                                                               " of ", world_size_, "): ")
                                                : absl::StrCat("ckpt: open ", root, ": "));
  engine_ = std::move(*engine);
}

c10::intrusive_ptr<SaveHandleHolder> EngineHolder::SaveAsync(
    int64_t step, const std::vector<std::string>& names, at::TensorList tensors,
    const std::string& extras_json, const std::vector<int64_t>& placements,
    const std::vector<std::vector<int64_t>>& global_shapes,
    const std::vector<std::vector<int64_t>>& global_offsets) {
  SaveInputs in = MakeSaveInputs(names, tensors, placements, global_shapes, global_offsets);
  auto handle = engine_->SaveAsync(step, std::span<const TensorView>(in.views), extras_json);
  ThrowIfError(handle.status(), absl::StrCat("ckpt: save of step ", step, ": "));
  // Eager staging of host tensors is finished: nothing needs to stay alive.
  // Otherwise (lazy, or device copies queued) the handle keeps the inputs.
  if (!lazy_ && !in.any_device) in.owners.clear();
  return c10::make_intrusive<SaveHandleHolder>(std::move(*handle), std::move(in.owners));
}

void EngineHolder::ReserveStaging(const std::vector<std::string>& names, at::TensorList tensors,
                                  bool wait, const std::vector<int64_t>& placements,
                                  const std::vector<std::vector<int64_t>>& global_shapes,
                                  const std::vector<std::vector<int64_t>>& global_offsets) {
  SaveInputs in = MakeSaveInputs(names, tensors, placements, global_shapes, global_offsets);
  ThrowIfError(engine_->ReserveStaging(std::span<const TensorView>(in.views), wait),
               "ckpt: reserve staging memory: ");
}

void EngineHolder::Close(bool cancel) {
  ThrowIfError(engine_->Close(cancel ? Engine::CloseMode::kCancel : Engine::CloseMode::kWait),
               "ckpt: close: ");
}

std::string EngineHolder::StatsJson() const { return EngineStatsJson(engine_->stats()); }

}  // namespace ckpt::torch_ext
