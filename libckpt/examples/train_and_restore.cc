// train_and_restore: the C++ main job. A deterministic "training loop" over a
// transformer-shaped state (weights + Adam moments) checkpoints every few
// steps, loses its memory at a chosen step (a simulated crash), restores the
// newest checkpoint, resumes, and checks that the final state is bit-identical
// to the run that never crashed.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "ckpt/engine.h"
#include "ckpt/reader.h"

ABSL_FLAG(std::string, root, "demo-checkpoints", "checkpoint root directory");
ABSL_FLAG(int, layers, 8, "transformer layers");
ABSL_FLAG(int, hidden, 512, "hidden size");
ABSL_FLAG(int, steps, 40, "training steps");
ABSL_FLAG(int, save_every, 5, "checkpoint every N steps");
ABSL_FLAG(int, crash_at, 27, "step at which the process 'crashes' and restores");

namespace {

struct State {
  std::vector<std::string> names;
  std::vector<std::vector<float>> tensors;  // params, then exp_avg, exp_avg_sq
  int64_t step = 0;
};

State MakeState(int layers, int hidden) {
  State s;
  auto add = [&](const std::string& name, size_t n) {
    for (const char* kind : {"param", "exp_avg", "exp_avg_sq"}) {
      s.names.push_back(std::string(kind) + "." + name);
      s.tensors.emplace_back(n, 0.0f);
    }
  };
  add("embed.weight", size_t(hidden) * 1024);
  for (int l = 0; l < layers; ++l) {
    std::string p = "layers." + std::to_string(l);
    for (const char* w : {".attn.qkv.weight", ".attn.out.weight"}) add(p + w, size_t(hidden) * hidden);
    add(p + ".mlp.up.weight", size_t(hidden) * hidden * 4);
    add(p + ".mlp.down.weight", size_t(hidden) * hidden * 4);
    add(p + ".norm.weight", hidden);
  }
  for (size_t t = 0; t < s.tensors.size(); t += 3) {
    for (size_t i = 0; i < s.tensors[t].size(); ++i) s.tensors[t][i] = std::sin(float(i % 977) + t);
  }
  return s;
}

// One Adam-like step with a deterministic pseudo-gradient.
void TrainStep(State& s) {
  ++s.step;
  for (size_t t = 0; t < s.tensors.size(); t += 3) {
    auto& w = s.tensors[t];
    auto& m = s.tensors[t + 1];
    auto& v = s.tensors[t + 2];
    for (size_t i = 0; i < w.size(); ++i) {
      float g = std::cos(w[i] * 3.0f + float(s.step));
      m[i] = 0.9f * m[i] + 0.1f * g;
      v[i] = 0.999f * v[i] + 0.001f * g * g;
      w[i] -= 1e-3f * m[i] / (std::sqrt(v[i]) + 1e-8f);
    }
  }
}

std::vector<ckpt::TensorView> Views(const State& s) {
  std::vector<ckpt::TensorView> views;
  for (size_t i = 0; i < s.tensors.size(); ++i) {
    views.push_back({s.names[i], ckpt::DType::kFloat32, {int64_t(s.tensors[i].size())},
                     s.tensors[i].data(), s.tensors[i].size() * sizeof(float)});
  }
  return views;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int steps = absl::GetFlag(FLAGS_steps);
  const int save_every = absl::GetFlag(FLAGS_save_every);
  const int crash_at = absl::GetFlag(FLAGS_crash_at);

  State reference = MakeState(absl::GetFlag(FLAGS_layers), absl::GetFlag(FLAGS_hidden));
  for (int i = 0; i < steps; ++i) TrainStep(reference);

  auto engine = ckpt::Engine::Open(absl::GetFlag(FLAGS_root), ckpt::EngineOptions{});
  if (!engine.ok()) {
    std::fprintf(stderr, "train_and_restore: %s\n", engine.status().ToString().c_str());
    return 1;
  }
  State state = MakeState(absl::GetFlag(FLAGS_layers), absl::GetFlag(FLAGS_hidden));
  uint64_t bytes = 0;
  for (const auto& t : state.tensors) bytes += t.size() * sizeof(float);
  std::printf("state: %zu tensors, %.1f MB; backend %s\n", state.tensors.size(), bytes / 1e6,
              std::string((*engine)->backend()).c_str());

  bool crashed = false;
  while (state.step < steps) {
    TrainStep(state);
    if (state.step % save_every == 0) {
      std::string extras = "{\"step\": " + std::to_string(state.step) + "}";
      auto stats = (*engine)->Save(state.step, Views(state), extras);
      if (!stats.ok()) {
        std::fprintf(stderr, "save failed: %s\n", stats.status().ToString().c_str());
        return 1;
      }
      std::printf("step %3lld: saved %zu shards in %.3f s (%.2f GB/s durable)\n",
                  (long long)state.step, stats->shard_count, stats->seconds,
                  stats->tensor_bytes / stats->seconds / 1e9);
    }
    if (!crashed && state.step == crash_at) {
      crashed = true;
      std::printf("step %3lld: simulated crash, state lost\n", (long long)state.step);
      state = MakeState(1, 1);  // memory is gone
      ckpt::ReaderOptions options;  // newest checkpoint that verifies
      auto reader = ckpt::Reader::Open(absl::GetFlag(FLAGS_root), options);
      if (!reader.ok()) {
        std::fprintf(stderr, "restore failed: %s\n", reader.status().ToString().c_str());
        return 1;
      }
      state = MakeState(absl::GetFlag(FLAGS_layers), absl::GetFlag(FLAGS_hidden));
      state.step = (*reader)->step();
      std::vector<ckpt::ReadTarget> targets;
      for (size_t i = 0; i < state.tensors.size(); ++i) {
        targets.push_back({state.names[i], state.tensors[i].data(), state.tensors[i].size() * 4});
      }
      auto t0 = std::chrono::steady_clock::now();
      absl::Status read = (*reader)->ReadInto(targets);
      double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (!read.ok()) {
        std::fprintf(stderr, "restore failed: %s\n", read.ToString().c_str());
        return 1;
      }
      std::printf("restored step %lld (verified) in %.3f s; resuming\n",
                  (long long)state.step, dt);
    }
  }
  for (size_t i = 0; i < state.tensors.size(); ++i) {
    if (std::memcmp(state.tensors[i].data(), reference.tensors[i].data(),
                    state.tensors[i].size() * sizeof(float)) != 0) {
      std::printf("MISMATCH in %s after resume\n", state.names[i].c_str());
      return 1;
    }
  }
  std::printf("resumed run is bit-identical to the uninterrupted run after %d steps\n", steps);
  return 0;
}
