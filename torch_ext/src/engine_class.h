// engine_class.h: the TorchScript custom classes `torch.classes.ckpt.Engine`
// and `torch.classes.ckpt.SaveHandle`, thin holders of ckpt::Engine and
// ckpt::SaveHandle.
#ifndef CKPT_TORCH_EXT_ENGINE_CLASS_H_
#define CKPT_TORCH_EXT_ENGINE_CLASS_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/custom_class.h>

#include "ckpt/engine.h"
#include "ckpt/options.h"
#include "ckpt/options_json.h"

namespace ckpt::torch_ext {

// `ParseEngineOptions` reads the options object given to `Engine(root,
// options_json)`: the library's JSON form of EngineOptions
// (ckpt/options_json.h; keys in docs/options.md). Throws ValueError for an
// unknown member or a value of the wrong type, naming it.
EngineOptions ParseEngineOptions(const std::string& options_json);

// `EngineOptionNames` lists the members `ParseEngineOptions` knows (the
// Python package checks option names against it before serializing them).
using ::ckpt::EngineOptionNames;

// `SaveHandleHolder` is one save in flight. It keeps the tensors the save
// reads alive until their bytes are staged: it lets go of them once
// `wait_staged`, `wait` or `done` saw staging finish, and its destructor
// waits for staging first if nobody did. Thread-safe.
class SaveHandleHolder : public torch::CustomClassHolder {
 public:
  SaveHandleHolder(std::shared_ptr<SaveHandle> handle, std::vector<at::Tensor> inputs);
  ~SaveHandleHolder() override;

  int64_t step() const { return handle_->step(); }
  // Raise the save's error (as the library words it), else return.
  void WaitStaged();
  void Wait();
  bool Done();
  bool Skipped() const { return handle_->skipped(); }
  // SaveStats as a JSON object (ckpt/json.h; complete once `Done()`).
  std::string StatsJson() const;

 private:
  void ReleaseInputs();

  std::shared_ptr<SaveHandle> handle_;
  std::mutex mu_;
  std::vector<at::Tensor> inputs_;  // GUARDED_BY(mu_)
};

// `EngineHolder` owns one ckpt::Engine.
class EngineHolder : public torch::CustomClassHolder {
 public:
  // Throws if `ckpt::Engine::Open` fails or the options do not parse.
  EngineHolder(const std::string& root, const std::string& options_json);
  // An engine opened with `options` as they are (e.g. with
  // `options.distributed` set: see `OpenEngine`). Throws if Open fails.
  EngineHolder(const std::string& root, const EngineOptions& options);
  // Waits for saves in flight (errors nobody collected are logged by the library).
  ~EngineHolder() override = default;

  // `torch.ops.ckpt.save_async`: see ops.cc. `placements` is empty (every
  // tensor kDefault) or one `TensorPlacement` value per tensor;
  // `global_shapes` / `global_offsets` place kSharded chunks (see
  // `MakeSaveInputs`).
  c10::intrusive_ptr<SaveHandleHolder> SaveAsync(
      int64_t step, const std::vector<std::string>& names, at::TensorList tensors,
      const std::string& extras_json, const std::vector<int64_t>& placements = {},
      const std::vector<std::vector<int64_t>>& global_shapes = {},
      const std::vector<std::vector<int64_t>>& global_offsets = {});
  // `torch.ops.ckpt.reserve_staging`: see ops.cc.
  void ReserveStaging(const std::vector<std::string>& names, at::TensorList tensors, bool wait,
                      const std::vector<int64_t>& placements = {},
                      const std::vector<std::vector<int64_t>>& global_shapes = {},
                      const std::vector<std::vector<int64_t>>& global_offsets = {});
  // Stops the engine (waiting for, or with `cancel` abandoning, saves in
  // flight); raises the first background error no handle reported.
  void Close(bool cancel);
  // EngineStats as a JSON object (ckpt/json.h).
  std::string StatsJson() const;
  std::string root() const { return engine_->root(); }
  std::string backend() const { return std::string(engine_->backend()); }
  bool lazy() const { return lazy_; }
  int64_t rank() const { return rank_; }
  int64_t world_size() const { return world_size_; }

 private:
  std::unique_ptr<Engine> engine_;
  bool lazy_ = false;
  int64_t rank_ = 0;
  int64_t world_size_ = 1;
};

}  // namespace ckpt::torch_ext

#endif  // CKPT_TORCH_EXT_ENGINE_CLASS_H_
