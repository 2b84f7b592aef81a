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
namespace {

using nlohmann::json;

// `Get<T>` reads member `key` of `obj` into `*out` if present; ValueError if
// it has the wrong type.
template <typename T>
void Get(const json& obj, const char* key, T* out) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return;
  try {
    *out = it->get<T>();
  } catch (const json::exception& e) {
    TORCH_CHECK_VALUE(false, "ckpt: engine option \"", key, "\": ", e.what());
  }
}

// `Choice` maps member `key` (a string among `names`) to its value.
template <typename E>
void GetChoice(const json& obj, const char* key,
               std::initializer_list<std::pair<const char*, E>> names, E* out) {
  std::string text;
  Get(obj, key, &text);
  if (text.empty()) return;
  std::string allowed;
  for (const auto& [name, value] : names) {
    if (text == name) {
      *out = value;
      return;
    }
    absl::StrAppend(&allowed, allowed.empty() ? "" : ", ", "\"", name, "\"");
  }
  TORCH_CHECK_VALUE(false, "ckpt: engine option \"", key, "\" is \"", text, "\"; expected one of ",
                    allowed);
}

}  // namespace

const std::vector<std::string>& EngineOptionNames() {
  static const std::vector<std::string>* const kNames = new std::vector<std::string>{
      "delta",         "topk_ratio",        "full_every",      "lazy",
      "staging_bytes", "compression_level", "when_busy",       "io_backend",
      "direct_io",     "create_root",       "metrics_jsonl_path", "write_during_eager_staging",
      "chunk_bytes",   "queue_depth",       "encode_buffers",  "shard_min_bytes",
      "shard_max_bytes", "watchdog_timeout_s", "stall_timeout_s", "prometheus_textfile_path",
      "background_nice", "staging_threads", "compression_codec", "adaptive_compression",
      "encode_threads", "delta_base", "max_restore_read_factor", "resume_deltas"};
  return *kNames;
}

EngineOptions ParseEngineOptions(const std::string& options_json) {
  json obj = json::parse(options_json, nullptr, /*allow_exceptions=*/false);
  TORCH_CHECK_VALUE(obj.is_object(), "ckpt: engine options must be a JSON object, got: ",
                    options_json);
  const std::vector<std::string>& known = EngineOptionNames();
  for (const auto& item : obj.items()) {
    const bool is_known = std::find(known.begin(), known.end(), item.key()) != known.end();
    TORCH_CHECK_VALUE(is_known, "ckpt: unknown engine option \"", item.key(), "\"");
  }
  EngineOptions options;
  GetChoice<DeltaOptions::Mode>(obj, "delta",
                                {{"none", DeltaOptions::Mode::kNone},
                                 {"exact", DeltaOptions::Mode::kExact},
                                 {"topk", DeltaOptions::Mode::kTopK}},
                                &options.delta.mode);
  Get(obj, "topk_ratio", &options.delta.topk_ratio);
  Get(obj, "full_every", &options.delta.full_every);
  Get(obj, "lazy", &options.lazy_staging);
  Get(obj, "write_during_eager_staging", &options.write_during_eager_staging);
  int64_t staging_bytes = 0;
  Get(obj, "staging_bytes", &staging_bytes);
  TORCH_CHECK_VALUE(staging_bytes >= 0, "ckpt: engine option \"staging_bytes\" is negative");
  options.staging_bytes = static_cast<size_t>(staging_bytes);
  Get(obj, "compression_level", &options.compression_level);
  GetChoice<CompressionCodec>(obj, "compression_codec",
                              {{"none", CompressionCodec::kNone},
                               {"zstd", CompressionCodec::kZstd},
                               {"planes", CompressionCodec::kPlanes}},
                              &options.compression.codec);
  Get(obj, "adaptive_compression", &options.compression.adaptive);
  GetChoice<DeltaOptions::Base>(obj, "delta_base",
                                {{"differential", DeltaOptions::Base::kDifferential},
                                 {"chained", DeltaOptions::Base::kChained}},
                                &options.delta.base);
  Get(obj, "max_restore_read_factor", &options.delta.max_restore_read_factor);
  Get(obj, "resume_deltas", &options.delta.resume_from_newest);
  GetChoice<EngineOptions::BusyPolicy>(
      obj, "when_busy",
      {{"wait", EngineOptions::BusyPolicy::kWait}, {"skip", EngineOptions::BusyPolicy::kSkip}},
      &options.when_busy);
  GetChoice<IoBackend>(obj, "io_backend",
                       {{"auto", IoBackend::kAuto},
                        {"uring", IoBackend::kUring},
                        {"threads", IoBackend::kThreads}},
                       &options.io.backend);
  GetChoice<DirectIoMode>(
      obj, "direct_io",
      {{"auto", DirectIoMode::kAuto}, {"on", DirectIoMode::kOn}, {"off", DirectIoMode::kOff}},
      &options.io.direct);
  Get(obj, "create_root", &options.create_root);
  Get(obj, "metrics_jsonl_path", &options.metrics_jsonl_path);
  Get(obj, "prometheus_textfile_path", &options.prometheus_textfile_path);
  const auto get_size = [&](const char* key, auto* out) {
    if (auto it = obj.find(key); it == obj.end() || it->is_null()) return;
    int64_t v = 0;
    Get(obj, key, &v);
    TORCH_CHECK_VALUE(v >= 0, "ckpt: engine option \"", key, "\" is negative");
    *out = static_cast<std::remove_reference_t<decltype(*out)>>(v);
  };
  get_size("chunk_bytes", &options.io.chunk_bytes);
  get_size("queue_depth", &options.io.queue_depth);
  get_size("encode_buffers", &options.io.encode_buffers);
  get_size("shard_min_bytes", &options.shard_min_bytes);
  get_size("shard_max_bytes", &options.shard_max_bytes);
  get_size("background_nice", &options.background_nice);
  get_size("staging_threads", &options.staging_threads);
  get_size("encode_threads", &options.compression.threads);
  const auto get_seconds = [&](const char* key, absl::Duration* out) {
    if (auto it = obj.find(key); it == obj.end() || it->is_null()) return;
    double v = 0;
    Get(obj, key, &v);
    TORCH_CHECK_VALUE(v >= 0, "ckpt: engine option \"", key, "\" is negative");
    *out = absl::Seconds(v);
  };
  get_seconds("watchdog_timeout_s", &options.watchdog_timeout);
  get_seconds("stall_timeout_s", &options.stall_timeout);
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
