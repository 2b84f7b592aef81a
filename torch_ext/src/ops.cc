// ops.cc: registers the `ckpt` TorchScript library.
//
//   torch.ops.load_library(".../_ckpt_torch.so")
//   engine = torch.classes.ckpt.Engine("/ckpt/run1", '{"delta": "exact"}')
//   h = torch.ops.ckpt.save_async(engine, 100, ["w"], [w], '{"epoch": 3}')
//   h.wait_staged()      # `w` may be mutated now (returns at once unless lazy)
//   h.wait()             # committed and durable, or raises the library's error
//   torch.ops.ckpt.reserve_staging(engine, ["w"], [w])  # pre-fault staging memory in the background
//   step, names, tensors, extras, skipped = torch.ops.ckpt.read(root, None)
//   code, message = torch.ops.ckpt.last_error()  # after catching: "NOT_FOUND", ...
//
// Schemas are written out here; the kernels (engine_class.cc, read_ops.cc)
// only convert types and call the library. Errors are c10 exceptions that
// carry the library's message: ValueError for invalid arguments, RuntimeError
// otherwise.
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <torch/custom_class.h>
#include <torch/library.h>

#include "engine_class.h"
#include "read_ops.h"
#include "torch_status.h"

namespace ckpt::torch_ext {
namespace {

// `int?` arrives as c10::optional (a distinct type before LibTorch 2.x).
std::optional<int64_t> Step(const c10::optional<int64_t>& step) {
  return step.has_value() ? std::optional<int64_t>(*step) : std::nullopt;
}

c10::intrusive_ptr<SaveHandleHolder> SaveAsyncOp(const c10::intrusive_ptr<EngineHolder>& engine,
                                                 int64_t step, std::vector<std::string> names,
                                                 at::TensorList tensors, std::string extras_json) {
  return engine->SaveAsync(step, names, tensors, extras_json);
}

void ReserveStagingOp(const c10::intrusive_ptr<EngineHolder>& engine, std::vector<std::string> names,
                      at::TensorList tensors, bool wait) {
  engine->ReserveStaging(names, tensors, wait);
}

ReadResult ReadOp(std::string root, c10::optional<int64_t> step) { return ReadStep(root, Step(step)); }

std::tuple<int64_t, std::string, std::vector<std::string>> ReadIntoOp(
    std::string root, c10::optional<int64_t> step, std::vector<std::string> names,
    at::TensorList tensors) {
  return ReadIntoStep(root, Step(step), names, tensors);
}

std::vector<int64_t> ListStepsOp(std::string root) { return ListSteps(root); }

std::string DescribeOp(std::string root, c10::optional<int64_t> step) {
  return DescribeStep(root, Step(step));
}

void VerifyOp(std::string root, int64_t step) { VerifyStep(root, step); }

std::tuple<std::string, std::string> LastErrorOp() {
  auto [code, message] = TakeLastError();
  return {std::move(code), std::move(message)};
}

std::vector<std::string> EngineOptionNamesOp() { return EngineOptionNames(); }

}  // namespace
}  // namespace ckpt::torch_ext

TORCH_LIBRARY(ckpt, m) {
  using namespace ckpt::torch_ext;
  m.class_<SaveHandleHolder>("SaveHandle")
      .def("step", &SaveHandleHolder::step)
      .def("wait_staged", &SaveHandleHolder::WaitStaged)
      .def("wait", &SaveHandleHolder::Wait)
      .def("done", &SaveHandleHolder::Done)
      .def("skipped", &SaveHandleHolder::Skipped)
      .def("stats_json", &SaveHandleHolder::StatsJson);

  m.class_<EngineHolder>("Engine")
      .def(torch::init<std::string, std::string>(), "",
           {torch::arg("root"), torch::arg("options_json") = "{}"})
      .def("close", &EngineHolder::Close, "", {torch::arg("cancel") = false})
      .def("stats_json", &EngineHolder::StatsJson)
      .def("root", &EngineHolder::root)
      .def("backend", &EngineHolder::backend)
      .def("lazy", &EngineHolder::lazy);

  m.class_<NewestFirstHolder>("NewestFirst")
      .def(torch::init<std::string>())
      .def("next", &NewestFirstHolder::Next)
      .def("skip", &NewestFirstHolder::Skip)
      .def("skipped", &NewestFirstHolder::Skipped)
      .def("raise_none_left", &NewestFirstHolder::RaiseNoneLeft);

  m.def(
      "save_async(__torch__.torch.classes.ckpt.Engine engine, int step, str[] names, "
      "Tensor[] tensors, str extras_json=\"{}\") -> __torch__.torch.classes.ckpt.SaveHandle",
      SaveAsyncOp);
  m.def(
      "reserve_staging(__torch__.torch.classes.ckpt.Engine engine, str[] names, Tensor[] tensors, "
      "bool wait=False) -> ()",
      ReserveStagingOp);
  m.def("read(str root, int? step=None) -> (int, str[], Tensor[], str, str[])", ReadOp);
  m.def(
      "read_into(str root, int? step, str[] names, Tensor[](a!) tensors) -> (int, str, str[])",
      ReadIntoOp);
  m.def("list_steps(str root) -> int[]", ListStepsOp);
  m.def("describe(str root, int? step=None) -> str", DescribeOp);
  m.def("verify(str root, int step) -> ()", VerifyOp);
  // The status code and message of the last library error raised on this
  // thread, cleared by the call; ("", "") if none (see TakeLastError).
  m.def("last_error() -> (str, str)", LastErrorOp);
  m.def("engine_option_names() -> str[]", EngineOptionNamesOp);
}
