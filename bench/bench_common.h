// Shared pieces of the benchmark programs: timing, synthetic states, and the
// baselines measured in the same run (memcpy, fio, torch.save).
#ifndef CKPT_BENCH_BENCH_COMMON_H_
#define CKPT_BENCH_BENCH_COMMON_H_

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/tensor.h"

namespace ckpt::bench {

using Clock = std::chrono::steady_clock;
double SecondsSince(Clock::time_point start);
double Median(std::vector<double> values);
double Round(double x);  // to 4 significant decimals, for JSON
void Log(const std::string& bench, const std::string& line);
[[noreturn]] void Die(const std::string& line);

// A synthetic state in one pre-faulted allocation; `views` point into it.
struct State {
  AlignedBytes memory;
  std::vector<TensorView> views;
  uint64_t bytes() const;
};

// ~`bytes` over ~`tensors` tensors shaped like a transformer: an embedding,
// then layers of attention/MLP weights (fp32 and bf16) and small norms.
State MakeTransformerState(uint64_t bytes, int tensors);
// `bytes` split evenly over `tensors` fp32 tensors, 10 per module.
State MakeUniformState(uint64_t bytes, int tensors);

struct FioResult {
  double gbps = 0;  // 1e9 bytes per second; 0 if fio did not run
  std::string error;
};
// fio, io_uring, O_DIRECT, sequential, `bytes` in blocks of `block` with
// `depth` in flight, in `dir` (created, then removed). Writes end with fsync.
FioResult RunFio(const std::string& fio, const std::string& dir, uint64_t bytes, uint64_t block,
                 int depth, bool read);

// Times torch.save of `state`'s shapes and dtypes with `script`
// (bench/torch_save_baseline.py) under `python`. Empty (with `note` saying
// why) when torch is not available.
std::vector<double> TorchSaveSeconds(const std::string& python, const std::string& script,
                                     const std::string& dir, const State& state, int reps,
                                     std::string* note);

}  // namespace ckpt::bench

#endif  // CKPT_BENCH_BENCH_COMMON_H_
