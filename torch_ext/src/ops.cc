// ops.cc: registers the `ckpt` TorchScript library.
//
//   torch.ops.load_library(".../_ckpt_torch.so")
//   engine = torch.classes.ckpt.Engine("/ckpt/run1", '{"delta": "exact"}')
//   h = torch.ops.ckpt.save_async(engine, 100, ["w"], [w], '{"epoch": 3}')
//   h.wait_staged()      # `w` may be mutated now (returns at once unless lazy)
//   h.wait()             # committed and durable, or raises the library's error
//   torch.ops.ckpt.reserve_staging(engine, ["w"], [w])  # pre-fault staging memory in the background
//   step, names, tensors, extras, skipped = torch.ops.ckpt.read(root, None)
//   bytes_read = torch.ops.ckpt.read_regions(root, step, ["w"], [[4, 0]], [box])  # w[4:4+n, :m]
//   engine = torch.ops.ckpt.open_engine(root, "{}", pg.boxed(), "ckpt/run1/0", 300.0)  # one rank
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

#include "ckpt/version.h"
#include "dist_ops.h"
#include "engine_class.h"
#include "read_ops.h"
#include "torch_status.h"

namespace ckpt::torch_ext {
namespace {

// `int?` arrives as c10::optional (a distinct type before LibTorch 2.x).
std::optional<int64_t> Step(const c10::optional<int64_t>& step) {
  return step.has_value() ? std::optional<int64_t>(*step) : std::nullopt;
}

// `int[][]?`: a list per tensor, or None for none (a list of lists takes no
// `[]` default in a schema).
using OptionalLists = c10::optional<std::vector<std::vector<int64_t>>>;
std::vector<std::vector<int64_t>> Lists(const OptionalLists& lists) {
  return lists.has_value() ? *lists : std::vector<std::vector<int64_t>>();
}

c10::intrusive_ptr<SaveHandleHolder> SaveAsyncOp(const c10::intrusive_ptr<EngineHolder>& engine,
                                                 int64_t step, std::vector<std::string> names,
                                                 at::TensorList tensors, std::string extras_json,
                                                 std::vector<int64_t> placements,
                                                 OptionalLists global_shapes,
                                                 OptionalLists global_offsets) {
  return engine->SaveAsync(step, names, tensors, extras_json, placements, Lists(global_shapes),
                           Lists(global_offsets));
}

void ReserveStagingOp(const c10::intrusive_ptr<EngineHolder>& engine, std::vector<std::string> names,
                      at::TensorList tensors, bool wait, std::vector<int64_t> placements,
                      OptionalLists global_shapes, OptionalLists global_offsets) {
  engine->ReserveStaging(names, tensors, wait, placements, Lists(global_shapes),
                         Lists(global_offsets));
}

c10::intrusive_ptr<EngineHolder> OpenEngineOp(std::string root, std::string options_json,
                                              c10::optional<c10::intrusive_ptr<c10d::ProcessGroup>> group,
                                              std::string key_prefix, double commit_timeout_s,
                                              bool shared_root) {
  return OpenEngine(root, options_json, group.has_value() ? *group : nullptr, key_prefix,
                    commit_timeout_s, shared_root);
}

std::tuple<std::string, std::string> StoreOpOp(c10::intrusive_ptr<c10d::ProcessGroup> group,
                                               std::string op, std::string key, std::string value,
                                               double timeout_s) {
  return StoreOp(group, op, key, value, timeout_s);
}

ReadResult ReadOp(std::string root, c10::optional<int64_t> step, c10::optional<int64_t> rank) {
  return ReadStep(root, Step(step), Step(rank));
}

std::tuple<int64_t, std::string, std::vector<std::string>> ReadIntoOp(
    std::string root, c10::optional<int64_t> step, std::vector<std::string> names,
    at::TensorList tensors, c10::optional<int64_t> rank) {
  return ReadIntoStep(root, Step(step), names, tensors, Step(rank));
}

int64_t ReadRegionsOp(std::string root, int64_t step, std::vector<std::string> names,
                      std::vector<std::vector<int64_t>> offsets, at::TensorList tensors,
                      c10::optional<int64_t> rank) {
  return ReadRegionsStep(root, step, names, offsets, tensors, Step(rank));
}

std::vector<int64_t> ListStepsOp(std::string root) { return ListSteps(root); }

std::string DescribeOp(std::string root, c10::optional<int64_t> step, c10::optional<int64_t> rank) {
  return DescribeStep(root, Step(step), Step(rank));
}

void VerifyOp(std::string root, int64_t step, c10::optional<int64_t> rank) {
  VerifyStep(root, step, Step(rank));
}

std::tuple<std::string, std::string> LastErrorOp() {
  auto [code, message] = TakeLastError();
  return {std::move(code), std::move(message)};
}

std::vector<std::string> EngineOptionNamesOp() { return EngineOptionNames(); }

std::string VersionOp() { return std::string(::ckpt::Version()); }

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
      .def("lazy", &EngineHolder::lazy)
      .def("rank", &EngineHolder::rank)
      .def("world_size", &EngineHolder::world_size);

  m.class_<StepReaderHolder>("StepReader")
      .def(torch::init<std::string, int64_t, int64_t>())
      .def("step", &StepReaderHolder::step)
      .def("world_size", &StepReaderHolder::world_size)
      .def("extras", &StepReaderHolder::extras)
      .def("read_into",
           [](const c10::intrusive_ptr<StepReaderHolder>& self, std::vector<std::string> names,
              std::vector<at::Tensor> tensors) { self->ReadInto(names, tensors); })
      .def("read_new", &StepReaderHolder::ReadNew)
      .def("describe", &StepReaderHolder::Describe)
      .def("read_regions",
           [](const c10::intrusive_ptr<StepReaderHolder>& self, std::vector<std::string> names,
              std::vector<std::vector<int64_t>> offsets, std::vector<at::Tensor> tensors) {
             return self->ReadRegions(names, offsets, tensors);
           })
      .def("bytes_read", &StepReaderHolder::bytes_read);

  m.class_<NewestFirstHolder>("NewestFirst")
      .def(torch::init<std::string>())
      .def("next", &NewestFirstHolder::Next)
      .def("skip", &NewestFirstHolder::Skip)
      .def("skipped", &NewestFirstHolder::Skipped)
      .def("raise_none_left", &NewestFirstHolder::RaiseNoneLeft);

  m.def(
      "save_async(__torch__.torch.classes.ckpt.Engine engine, int step, str[] names, "
      "Tensor[] tensors, str extras_json=\"{}\", int[] placements=[], int[][]? global_shapes=None, "
      "int[][]? global_offsets=None) -> __torch__.torch.classes.ckpt.SaveHandle",
      SaveAsyncOp);
  m.def(
      "reserve_staging(__torch__.torch.classes.ckpt.Engine engine, str[] names, Tensor[] tensors, "
      "bool wait=False, int[] placements=[], int[][]? global_shapes=None, "
      "int[][]? global_offsets=None) -> ()",
      ReserveStagingOp);
  // One rank of a multi-rank checkpoint on a torch.distributed group (pass
  // `pg.boxed()`); no group, or a group of one, is a single-process engine.
  m.def(
      "open_engine(str root, str options_json=\"{}\", "
      "__torch__.torch.classes.c10d.ProcessGroup? group=None, str key_prefix=\"ckpt\", "
      "float commit_timeout_s=300., bool shared_root=True) -> __torch__.torch.classes.ckpt.Engine",
      OpenEngineOp);
  // A group's c10d store through the adapter (C10dStore): ("", value) or
  // (code, message). Used by the adapter's tests and by the multi-rank
  // upload behind the save (_tier.py), from its background thread.
  m.def(
      "_store_op(__torch__.torch.classes.c10d.ProcessGroup group, str op, str key, "
      "str value=\"\", float timeout_s=1.) -> (str, str)",
      StoreOpOp);
  m.def("read(str root, int? step=None, int? rank=None) -> (int, str[], Tensor[], str, str[])",
        ReadOp);
  m.def(
      "read_into(str root, int? step, str[] names, Tensor[](a!) tensors, int? rank=None) -> "
      "(int, str, str[])",
      ReadIntoOp);
  // Boxes of tensors of checkpoint `step`: tensors[i] (its shape is the
  // box's) gets the elements of names[i] from offsets[i] on; returns the
  // bytes read from shard files (Reader::bytes_read).
  m.def(
      "read_regions(str root, int step, str[] names, int[][] offsets, Tensor[](a!) tensors, "
      "int? rank=None) -> int",
      ReadRegionsOp);
  m.def("list_steps(str root) -> int[]", ListStepsOp);
  m.def("describe(str root, int? step=None, int? rank=None) -> str", DescribeOp);
  m.def("verify(str root, int step, int? rank=None) -> ()", VerifyOp);
  // The status code and message of the last library error raised on this
  // thread, cleared by the call; ("", "") if none (see TakeLastError).
  m.def("last_error() -> (str, str)", LastErrorOp);
  m.def("engine_option_names() -> str[]", EngineOptionNamesOp);
  // The library's version (CMakeLists.txt's project version).
  m.def("version() -> str", VersionOp);
}
