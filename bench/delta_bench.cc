// delta_bench: bytes written per delta vs a full save, blocked time of a
// delta save vs a full one, and restore time of a 10-delta chain vs one full
// checkpoint — for exact and top-k deltas at several change rates, in one run.
// Prints one JSON line per (mode, changed fraction):
// {"bench": "delta", "mode", "changed_frac", "delta_bytes_over_full", "blocked_s",
//  "full_blocked_s", "chain_restore_s", "full_restore_s", ...}
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench_common.h"
#include "ckpt/engine.h"
#include "ckpt/reader.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, dir, "", "Directory to write under (required).");
ABSL_FLAG(uint64_t, bytes, 1ull << 30, "Bytes of the fp32 state.");
ABSL_FLAG(int, tensors, 64, "Tensors in the state.");
ABSL_FLAG(int, chain, 10, "Deltas per chain.");
ABSL_FLAG(std::string, fractions, "0.001,0.01,0.1", "Changed fractions to measure.");

namespace {

using ckpt::bench::Clock;
using ckpt::bench::Median;
using ckpt::bench::Round;
using ckpt::bench::SecondsSince;

// Changes `fraction` of the fp32 elements of every tensor by a small amount.
void Perturb(ckpt::bench::State& state, double fraction, std::mt19937_64& rng) {
  for (ckpt::TensorView& v : state.views) {
    float* f = static_cast<float*>(const_cast<void*>(v.data));
    const size_t n = v.nbytes / 4;
    const size_t k = static_cast<size_t>(fraction * n);
    for (size_t c = 0; c < k; ++c) f[rng() % n] += 1e-3f * static_cast<float>((rng() % 2000) - 1000);
  }
}

void DropCaches() {
  std::ofstream("/proc/sys/vm/drop_caches") << "1\n";  // best effort (root only)
}

double Restore(const std::string& root, int64_t step, ckpt::bench::State& into) {
  DropCaches();
  ckpt::ReaderOptions options;
  options.step = step;
  const Clock::time_point start = Clock::now();
  auto reader = ckpt::Reader::Open(root, options);
  if (!reader.ok()) ckpt::bench::Die(std::string(reader.status().ToString()));
  std::vector<ckpt::ReadTarget> targets;
  for (const ckpt::TensorView& v : into.views) {
    targets.push_back({v.name, const_cast<void*>(v.data), v.nbytes});
  }
  absl::Status s = (*reader)->ReadInto(targets);
  if (!s.ok()) ckpt::bench::Die(std::string(s.ToString()));
  return SecondsSince(start);
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string dir = absl::GetFlag(FLAGS_dir);
  if (dir.empty()) ckpt::bench::Die("--dir is required");
  std::filesystem::create_directories(dir);
  const int chain = absl::GetFlag(FLAGS_chain);
  ckpt::bench::State state = ckpt::bench::MakeUniformState(absl::GetFlag(FLAGS_bytes),
                                                           absl::GetFlag(FLAGS_tensors));
  ckpt::bench::State restored = ckpt::bench::MakeUniformState(absl::GetFlag(FLAGS_bytes),
                                                              absl::GetFlag(FLAGS_tensors));
  // Weights-like values (the generator's bytes are random bit patterns).
  std::mt19937_64 rng(1);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (ckpt::TensorView& v : state.views) {
    float* f = static_cast<float*>(const_cast<void*>(v.data));
    for (size_t i = 0; i < v.nbytes / 4; ++i) f[i] = normal(rng);
  }
  std::vector<double> fractions;
  for (const auto& part : absl::StrSplit(absl::GetFlag(FLAGS_fractions), ',')) {
    fractions.push_back(std::stod(std::string(part)));
  }
  for (const char* mode : {"exact", "topk"}) {
    for (double fraction : fractions) {
      const std::string root = absl::StrCat(dir, "/", mode, "-", fraction);
      ckpt::bench::RemoveAndSettle(root);
      ckpt::EngineOptions options;
      options.delta.mode = std::string(mode) == "exact" ? ckpt::DeltaOptions::Mode::kExact
                                                        : ckpt::DeltaOptions::Mode::kTopK;
      options.delta.topk_ratio = 0.01;
      options.delta.full_every = chain + 2;
      options.watchdog_timeout = absl::ZeroDuration();
      auto engine = ckpt::Engine::Open(root, options);
      if (!engine.ok()) ckpt::bench::Die(std::string(engine.status().ToString()));
      // Step 0 is the cold save (pool and reference allocated); step 1 a warm
      // full save is forced by a fresh chain: use step 0 as the base, and time
      // a full save separately on a second engine below.
      auto first = (*engine)->Save(0, state.views);
      if (!first.ok()) ckpt::bench::Die(std::string(first.status().ToString()));
      std::vector<double> blocked, delta_bytes;
      for (int i = 1; i <= chain; ++i) {
        Perturb(state, fraction, rng);
        const Clock::time_point start = Clock::now();
        auto handle = (*engine)->SaveAsync(i, state.views);
        blocked.push_back(SecondsSince(start));
        if (!handle.ok() || !(*handle)->Wait().ok()) ckpt::bench::Die("delta save failed");
        if ((*handle)->stats().kind != ckpt::CheckpointKind::kDelta) ckpt::bench::Die("expected a delta save");
        delta_bytes.push_back(static_cast<double>((*handle)->stats().file_bytes));
      }
      (void)(*engine)->Close();
      // A warm full save of the same state, on its own engine.
      ckpt::EngineOptions full_options;
      full_options.watchdog_timeout = absl::ZeroDuration();
      auto full_engine = ckpt::Engine::Open(root + "-full", full_options);
      (void)(*full_engine)->Save(0, state.views);  // cold
      const Clock::time_point start = Clock::now();
      auto full = (*full_engine)->SaveAsync(1, state.views);
      const double full_blocked = SecondsSince(start);
      if (!full.ok() || !(*full)->Wait().ok()) ckpt::bench::Die("full save failed");
      const double full_bytes = static_cast<double>((*full)->stats().file_bytes);
      (void)(*full_engine)->Close();

      const double chain_restore = Restore(root, chain, restored);
      const double full_restore = Restore(root + "-full", 1, restored);
      nlohmann::ordered_json line;
      line["bench"] = "delta";
      line["mode"] = mode;
      line["changed_frac"] = fraction;
      line["bytes"] = state.bytes();
      line["delta_bytes_over_full"] = Round(Median(delta_bytes) / full_bytes);
      line["blocked_s"] = Round(Median(blocked));
      line["full_blocked_s"] = Round(full_blocked);
      line["chain_length"] = chain;
      line["chain_restore_s"] = Round(chain_restore);
      line["full_restore_s"] = Round(full_restore);
      std::cout << line.dump() << std::endl;
      ckpt::bench::RemoveAndSettle(root);
      ckpt::bench::RemoveAndSettle(root + "-full");
    }
  }
  return 0;
}
