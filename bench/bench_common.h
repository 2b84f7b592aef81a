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

// Removes `path` (recursively) and then sync()s, so the removal is settled
// before the next measurement: on a file system mounted with `discard` (the
// development VM's ext4) freed blocks are discarded in the next journal
// commit, and otherwise the next measured fsync would pay for them.
void RemoveAndSettle(const std::string& path);

// A synthetic state in one pre-faulted, 4 KiB-aligned allocation. Each of
// `views` starts at a 4 KiB-aligned offset of `memory` (its bytes rounded up
// to 4 KiB, zero padding in between), so `memory.size()` is the sum of the
// rounded sizes. The contents are pseudo-random (incompressible).
struct State {
  AlignedBytes memory;
  std::vector<TensorView> views;
  uint64_t bytes() const;  // the views' bytes, padding excluded
};

// Exactly `bytes` in exactly `tensors` tensors (>= 4) shaped like a
// transformer with hidden size h: an fp32 embedding (8h x h); layers of bf16
// q/k/v/o (h x h) and gate/up/down (4h x h, h x 4h) weights with fp32 norms
// and q/k/v biases (12 tensors each); an fp32 final norm; a bf16 `lm_head`
// (8h x h); fp32 buffers (h/2) filling up the count; and one uint8 blob that
// makes the total exact (so sizes are not all 4 KiB multiples). h is the
// largest multiple of 16 that leaves room for the blob. Dies if `bytes` is
// too small for h = 16.
State MakeTransformerState(uint64_t bytes, int tensors);
// `bytes / tensors` rounded down to whole fp32 elements, in each of
// `tensors` fp32 tensors, 10 per module.
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
