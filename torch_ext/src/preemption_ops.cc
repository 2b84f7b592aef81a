// preemption_ops.cc: `torch.ops.ckpt.handle_preemption` and friends, over
// ckpt::PreemptionWatch (ckpt/preemption.h). Signal dispositions are the
// process's, so the watch is too: one, held here, whichever Checkpointer
// asked for it.
#include <cstdint>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include <torch/library.h>

#include "absl/time/time.h"
#include "ckpt/preemption.h"
#include "torch_status.h"

namespace ckpt::torch_ext {
namespace {

std::mutex watch_mu;
std::unique_ptr<PreemptionWatch> watch;  // GUARDED_BY(watch_mu)

bool SameOptions(const PreemptionOptions& a, const PreemptionOptions& b) {
  return a.signals == b.signals && a.grace == b.grace &&
         a.end_process_at_deadline == b.end_process_at_deadline &&
         a.cleanup_allowance == b.cleanup_allowance;
}

// Installs the watch, or replaces one with other options (refused once
// preempted: the deadline already runs). The same options again: nothing.
void HandlePreemptionOp(const std::vector<int64_t>& signals, double grace_s, bool end_process,
                        double cleanup_allowance_s) {
  PreemptionOptions options;
  options.signals.assign(signals.begin(), signals.end());
  options.grace = absl::Seconds(grace_s);
  options.end_process_at_deadline = end_process;
  options.cleanup_allowance = absl::Seconds(cleanup_allowance_s);
  std::lock_guard<std::mutex> lock(watch_mu);
  if (watch != nullptr) {
    if (SameOptions(watch->options(), options)) return;
    if (watch->preempted()) {
      ThrowIfError(absl::FailedPreconditionError(
                       "preemption: already preempted; the watch's options can no longer change"),
                   "ckpt: handle_preemption");
    }
    watch.reset();
  }
  auto installed = PreemptionWatch::Install(options);
  ThrowIfError(installed.status(), "ckpt: handle_preemption");
  watch = std::move(*installed);
}

void StopHandlingPreemptionOp() {
  std::lock_guard<std::mutex> lock(watch_mu);
  watch.reset();
}

// (signal, seconds left until the deadline): (0, -1.) until preempted.
std::tuple<int64_t, double> PreemptionOp() {
  std::lock_guard<std::mutex> lock(watch_mu);
  if (watch == nullptr || !watch->preempted()) return {0, -1.0};
  return {watch->signal(), absl::ToDoubleSeconds(watch->remaining())};
}

}  // namespace
}  // namespace ckpt::torch_ext

TORCH_LIBRARY_FRAGMENT(ckpt, m) {
  using namespace ckpt::torch_ext;
  m.def("handle_preemption(int[] signals, float grace_s, bool end_process_at_deadline=True, "
        "float cleanup_allowance_s=3.) -> ()",
        HandlePreemptionOp);
  m.def("stop_handling_preemption() -> ()", StopHandlingPreemptionOp);
  m.def("preemption() -> (int, float)", PreemptionOp);
}
