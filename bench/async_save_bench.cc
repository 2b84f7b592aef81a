// async_save_bench: how long SaveAsync blocks a training loop, next to a
// plain memcpy of the same bytes and to torch.save, and how fast the save
// then reaches disk durably, next to fio — all measured in one run.
//
// A transformer-like state (--bytes over --tensors tensors, fp32 and bf16) is
// allocated and pre-faulted once. The engine's first save is "cold" (it
// allocates and pre-faults the staging pool) and reported apart; then
// --saves steady-state saves each time SaveAsync (the blocked time) and the
// commit (durable throughput). Right before each, a memcpy of the same
// tensors into pre-touched memory is timed: blocked_over_memcpy is the median
// of the per-save ratios, so a load change on a shared machine hits both
// sides. The same saves are repeated with write_during_eager_staging (the
// writes overlapping the caller's copy) for comparison. A second engine saves the same bytes split
// into --small_tensors tensors, for the per-byte cost of many small tensors.
// Prints JSON lines: {"bench": "async_save", ...} and
// {"bench": "async_save", "case": "small_tensors", ...}.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "bench_common.h"
#include "ckpt/catalog.h"
#include "ckpt/engine.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, dir, "", "Directory to write under (required).");
ABSL_FLAG(uint64_t, bytes, 1200ull << 20, "Total bytes of the state.");
ABSL_FLAG(int, tensors, 150, "Tensors in the state.");
ABSL_FLAG(int, small_tensors, 10000, "Tensors of the small-tensor case (same bytes); 0 skips it.");
ABSL_FLAG(int, saves, 5, "Steady-state saves (after the cold one).");
ABSL_FLAG(std::string, python, "python3", "Interpreter with torch, for torch.save.");
ABSL_FLAG(std::string, torch_script, "", "Path of bench/torch_save_baseline.py; empty skips it.");
ABSL_FLAG(int, torch_reps, 3, "torch.save repetitions.");
ABSL_FLAG(std::string, fio, "fio", "fio binary; empty skips fio.");
ABSL_FLAG(double, lazy_compute_s, 0.5,
          "Lazy mode: seconds of simulated forward/backward (the host thread idle, "
          "as while a GPU computes) between SaveAsync and WaitStaged.");

namespace {

using ckpt::bench::Clock;
using ckpt::bench::Median;
using ckpt::bench::SecondsSince;
using Json = nlohmann::ordered_json;

struct Run {
  double cold_blocked_s = 0;
  std::vector<double> blocked_s;
  // Lazy mode: SaveAsync plus what WaitStaged still waited after the
  // simulated compute — all a training loop is held.
  std::vector<double> loop_blocked_s;
  std::vector<double> memcpy_s;  // the baseline copy timed just before each save
  std::vector<double> fio_gbps;  // fio's durable write, run just before each save
  std::vector<double> durable_s;  // SaveAsync start -> committed
  uint64_t file_bytes = 0;
  std::string backend;
};

// The baseline: a plain memcpy of the state's tensors into pre-touched memory.
class BaselineCopy {
 public:
  explicit BaselineCopy(const std::vector<ckpt::TensorView>& views) : views_(views) {
    uint64_t bytes = 0;
    for (const ckpt::TensorView& v : views) bytes += v.nbytes;
    auto buffer = ckpt::AlignedBytes::Allocate(bytes, /*prefault=*/true);
    if (!buffer.ok()) ckpt::bench::Die("cannot allocate the memcpy baseline's buffer");
    buffer_ = std::move(*buffer);
  }
  double Seconds() {
    const Clock::time_point start = Clock::now();
    char* out = static_cast<char*>(buffer_.data());
    for (const ckpt::TensorView& v : views_) {
      std::memcpy(out, v.data, v.nbytes);
      out += v.nbytes;
    }
    return SecondsSince(start);
  }

 private:
  const std::vector<ckpt::TensorView>& views_;
  ckpt::AlignedBytes buffer_;
};

struct SaveMode {
  bool lazy = false;
  bool write_during_eager_staging = false;
  // Lazy mode: idle time between SaveAsync and WaitStaged, as a training step
  // spends its forward/backward pass before the optimizer mutates tensors.
  double compute_s = 0;
};

// fio writing the same bytes (O_DIRECT, io_uring, 1 MiB blocks, depth 32,
// fsync at the end), the durable-throughput baseline.
struct BaselineFio {
  std::string fio;  // binary; empty: none
  std::string dir;
  uint64_t bytes = 0;
  double Gbps() const {
    return ckpt::bench::RunFio(fio, dir, bytes, 1 << 20, 32, /*read=*/false).gbps;
  }
};

// Saves `views` 1 + `saves` times, each waited for. With `baseline` (and
// `fio`), the memcpy (and fio) baseline is timed right before every
// steady-state save, so each save has baselines measured under the same
// machine and disk load (fio's own figure swings by 2x between runs here).
Run SaveRepeatedly(const std::string& root, const std::vector<ckpt::TensorView>& views, int saves,
                   SaveMode mode = {}, BaselineCopy* baseline = nullptr,
                   std::vector<double>* staged_s = nullptr, const BaselineFio* fio = nullptr) {
  ckpt::EngineOptions options;
  options.lazy_staging = mode.lazy;
  options.write_during_eager_staging = mode.write_during_eager_staging;
  auto engine = ckpt::Engine::Open(root, options);
  if (!engine.ok()) ckpt::bench::Die(std::string(engine.status().ToString()));
  Run run;
  run.backend = std::string((*engine)->backend());
  for (int i = 0; i <= saves; ++i) {
    if (i > 0 && fio != nullptr && !fio->fio.empty()) run.fio_gbps.push_back(fio->Gbps());
    if (i > 0 && baseline != nullptr) run.memcpy_s.push_back(baseline->Seconds());
    const Clock::time_point start = Clock::now();
    auto handle = (*engine)->SaveAsync(i, views);
    const double blocked = SecondsSince(start);
    if (!handle.ok()) ckpt::bench::Die(std::string(handle.status().ToString()));
    if (mode.lazy && i > 0) {
      if (staged_s != nullptr) {
        // A separate probe of when the background copy finishes.
        (void)(*handle)->WaitStaged();
        staged_s->push_back(SecondsSince(start));
      } else {
        std::this_thread::sleep_for(std::chrono::duration<double>(mode.compute_s));
        const Clock::time_point wait_start = Clock::now();
        (void)(*handle)->WaitStaged();
        run.loop_blocked_s.push_back(blocked + SecondsSince(wait_start));
      }
    }
    absl::Status durable = (*handle)->Wait();
    const double total = SecondsSince(start);
    if (!durable.ok()) ckpt::bench::Die(std::string(durable.ToString()));
    run.file_bytes = (*handle)->stats().file_bytes;
    if (i == 0) {
      run.cold_blocked_s = blocked;
    } else {
      run.blocked_s.push_back(blocked);
      run.durable_s.push_back(total);
    }
    const ckpt::SaveStats stats = (*handle)->stats();
    ckpt::bench::Log("async_save",
                     absl::StrCat("save ", i, ": blocked ", blocked, " s, durable ", total,
                                  " s (staging ", stats.staging_s, " s, writing+commit ",
                                  stats.persist_s, " s)"));
    if (i > 0) ckpt::bench::RemoveAndSettle(root + "/" + ckpt::StepDirName(i - 1));
  }
  return run;
}

// The median of a[i] / b[i].
double MedianRatio(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> ratios;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) ratios.push_back(a[i] / b[i]);
  return Median(ratios);
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string dir = absl::GetFlag(FLAGS_dir);
  if (dir.empty()) ckpt::bench::Die("--dir is required");
  std::filesystem::create_directories(dir);
  const uint64_t bytes = absl::GetFlag(FLAGS_bytes);

  ckpt::bench::State state = ckpt::bench::MakeTransformerState(bytes, absl::GetFlag(FLAGS_tensors));
  const uint64_t state_bytes = state.bytes();
  BaselineCopy baseline(state.views);

  const BaselineFio fio_baseline{absl::GetFlag(FLAGS_fio), dir + "/fio", state_bytes};
  Run large = SaveRepeatedly(dir + "/large", state.views, absl::GetFlag(FLAGS_saves), {}, &baseline,
                             nullptr, &fio_baseline);
  const double blocked = Median(large.blocked_s);
  const double memcpy_s = Median(large.memcpy_s);
  const double blocked_over_memcpy = MedianRatio(large.blocked_s, large.memcpy_s);
  // The same saves with writing overlapped with the caller's copy.
  Run overlapped = SaveRepeatedly(dir + "/overlapped", state.views, absl::GetFlag(FLAGS_saves),
                                  {.write_during_eager_staging = true}, &baseline);
  const double durable = Median(large.durable_s);
  const double persist_gbps = state_bytes / durable / 1e9;


  // Lazy mode: SaveAsync returns at once; the copy overlaps the caller's
  // next compute, which must only call WaitStaged before mutating tensors.
  std::vector<double> lazy_staged;
  Run lazy = SaveRepeatedly(dir + "/lazy", state.views, absl::GetFlag(FLAGS_saves),
                            {.lazy = true}, nullptr, &lazy_staged);
  const double lazy_blocked = Median(lazy.blocked_s);
  const double compute_s = absl::GetFlag(FLAGS_lazy_compute_s);
  Run lazy_loop = SaveRepeatedly(dir + "/lazy_loop", state.views, absl::GetFlag(FLAGS_saves),
                                 {.lazy = true, .compute_s = compute_s});
  const double lazy_loop_blocked = Median(lazy_loop.loop_blocked_s);

  std::vector<double> torch_s;
  std::string torch_note;
  if (!absl::GetFlag(FLAGS_torch_script).empty()) {
    torch_s = ckpt::bench::TorchSaveSeconds(absl::GetFlag(FLAGS_python),
                                            absl::GetFlag(FLAGS_torch_script), dir + "/torch",
                                            state, absl::GetFlag(FLAGS_torch_reps), &torch_note);
  }
  const double torch_save = torch_s.empty() ? 0 : Median(torch_s);

  Json line;
  line["bench"] = "async_save";
  line["bytes"] = state_bytes;
  line["tensors"] = state.views.size();
  line["backend"] = large.backend;
  line["cold_blocked_s"] = ckpt::bench::Round(large.cold_blocked_s);
  line["blocked_s"] = ckpt::bench::Round(blocked);
  line["memcpy_s"] = ckpt::bench::Round(memcpy_s);
  line["blocked_over_memcpy"] = ckpt::bench::Round(blocked_over_memcpy);
  line["torch_save_s"] = torch_s.empty() ? Json() : Json(ckpt::bench::Round(torch_save));
  line["torch_save_over_blocked"] = torch_s.empty() ? Json() : Json(ckpt::bench::Round(torch_save / blocked));
  if (!torch_note.empty()) line["torch_note"] = torch_note;
  line["lazy_blocked_s"] = lazy_blocked;
  line["lazy_staged_s"] = ckpt::bench::Round(Median(lazy_staged));
  line["torch_save_over_lazy_blocked"] =
      torch_s.empty() || lazy_blocked <= 0 ? Json() : Json(std::round(torch_save / lazy_blocked));
  line["overlapped_blocked_over_memcpy"] =
      ckpt::bench::Round(MedianRatio(overlapped.blocked_s, overlapped.memcpy_s));
  line["overlapped_durable_s"] = ckpt::bench::Round(Median(overlapped.durable_s));
  line["lazy_compute_s"] = compute_s;
  line["lazy_loop_blocked_s"] = lazy_loop_blocked;
  line["torch_save_over_lazy_loop_blocked"] =
      torch_s.empty() || lazy_loop_blocked <= 0 ? Json()
                                                 : Json(std::round(torch_save / lazy_loop_blocked));
  line["durable_s"] = ckpt::bench::Round(durable);
  line["persist_gbps"] = ckpt::bench::Round(persist_gbps);
  // Per save: bytes / (SaveAsync -> committed), over the fio run before it.
  std::vector<double> persist_over_fio;
  std::vector<double> fio_ok;  // fio runs that worked
  Json fio_series = Json::array();
  for (size_t i = 0; i < large.fio_gbps.size() && i < large.durable_s.size(); ++i) {
    fio_series.push_back(ckpt::bench::Round(large.fio_gbps[i]));
    if (large.fio_gbps[i] > 0) {
      fio_ok.push_back(large.fio_gbps[i]);
      persist_over_fio.push_back(state_bytes / large.durable_s[i] / 1e9 / large.fio_gbps[i]);
    }
  }
  line["fio_write_gbps"] = fio_ok.empty() ? Json() : Json(ckpt::bench::Round(Median(fio_ok)));
  line["persist_over_fio"] =
      persist_over_fio.empty() ? Json() : Json(ckpt::bench::Round(Median(persist_over_fio)));
  line["fio_write_gbps_series"] = fio_series;
  // The other modes against the median fio run (they are not paired with fio
  // runs of their own).
  auto over_fio = [&](const Run& run) {
    return fio_ok.empty() || run.durable_s.empty()
               ? Json()
               : Json(ckpt::bench::Round(state_bytes / Median(run.durable_s) / 1e9 / Median(fio_ok)));
  };
  line["overlapped_persist_over_fio"] = over_fio(overlapped);
  line["lazy_durable_s"] = ckpt::bench::Round(Median(lazy.durable_s));
  line["lazy_persist_over_fio"] = over_fio(lazy);
  Json series = Json::array();
  for (double b : large.blocked_s) series.push_back(ckpt::bench::Round(b));
  line["blocked_series_s"] = series;
  Json torch_series = Json::array();
  for (double t : torch_s) torch_series.push_back(ckpt::bench::Round(t));
  line["torch_save_series_s"] = torch_series;
  std::cout << line.dump() << std::endl;

  const int small = absl::GetFlag(FLAGS_small_tensors);
  if (small > 0) {
    ckpt::bench::State many = ckpt::bench::MakeUniformState(state_bytes, small);
    Run run = SaveRepeatedly(dir + "/small", many.views, std::max(2, absl::GetFlag(FLAGS_saves) / 2));
    const double small_blocked = Median(run.blocked_s);
    const double small_durable = Median(run.durable_s);
    const double per_byte_large = durable / state_bytes;
    const double per_byte_small = small_durable / many.bytes();
    Json s;
    s["bench"] = "async_save";
    s["case"] = "small_tensors";
    s["tensors"] = many.views.size();
    s["bytes"] = many.bytes();
    s["file_bytes"] = run.file_bytes;
    s["blocked_s"] = ckpt::bench::Round(small_blocked);
    s["durable_s"] = ckpt::bench::Round(small_durable);
    s["large_tensors"] = state.views.size();
    s["large_durable_s"] = ckpt::bench::Round(durable);
    s["blocked_per_byte_over_large"] =
        ckpt::bench::Round((small_blocked / many.bytes()) / (blocked / state_bytes));
    s["per_byte_cost_over_large"] = ckpt::bench::Round(per_byte_small / per_byte_large);
    std::cout << s.dump() << std::endl;
  }
  ckpt::bench::RemoveAndSettle(dir);
  return 0;
}
