// chain_restore_bench: how fast a delta chain restores, per stored byte,
// against a full checkpoint of the same state (issue 16: restores whose cost
// is proportional to their bytes). A GPT-style fp32 state (weights and
// AdamW's two moments) is trained `warmup` AdamW steps, then saved `saves`
// times with exact deltas (one AdamW step between saves: every element
// changes a little), the first save full. Restores of the newest step and of
// the full one are timed (`Reader::Open` + `ReadAll`, the median of `reps`,
// the two alternating so that both meet the same disk), each checked
// against the state it saved; then `Verify` of the newest. Prints one JSON line per delta
// base: {"bench": "chain_restore", "base", "links", "full_restore_s",
//  "chain_restore_s", "full_mbps", "chain_mbps", "chain_over_full_mbps",
//  "chain_read_over_full", "delta_over_full", "verify_s", ...}
// (MB/s: stored bytes the reader read, 1e6 per second.)
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
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
ABSL_FLAG(int, hidden, 256, "Hidden size of the model (60 MB of state at 256).");
ABSL_FLAG(int, layers, 5, "Transformer layers.");
ABSL_FLAG(int, warmup, 20, "AdamW steps before the first save.");
ABSL_FLAG(int, saves, 11, "Saves (the first full; full_every is this).");
ABSL_FLAG(int, reps, 7, "Timed restores of each checkpoint (median; full and chain alternate).");
ABSL_FLAG(std::string, bases, "chained,differential", "Delta bases to measure.");

namespace {

using ckpt::bench::Clock;
using ckpt::bench::Median;
using ckpt::bench::Round;
using ckpt::bench::SecondsSince;

// One parameter with AdamW's moments, each saved as a tensor.
struct Param {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> w, m, v;
};

std::vector<Param> MakeModel(int h, int layers, std::mt19937_64& rng) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {{"wte", {16 * h, h}}, {"wpe", {4 * h, h}}};
  for (int l = 0; l < layers; ++l) {
    const std::string p = absl::StrCat("h.", l, ".");
    for (const char* ln : {"ln_1", "ln_2"}) {
      shapes.push_back({p + ln + ".weight", {h}});
      shapes.push_back({p + ln + ".bias", {h}});
    }
    shapes.push_back({p + "attn.c_attn.weight", {h, 3 * h}});
    shapes.push_back({p + "attn.c_attn.bias", {3 * h}});
    shapes.push_back({p + "attn.c_proj.weight", {h, h}});
    shapes.push_back({p + "mlp.c_fc.weight", {h, 4 * h}});
    shapes.push_back({p + "mlp.c_proj.weight", {4 * h, h}});
  }
  shapes.push_back({"ln_f.weight", {h}});
  std::normal_distribution<float> init(0.0f, 0.02f);
  std::vector<Param> model;
  for (auto& [name, shape] : shapes) {
    size_t n = 1;
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    Param p{name, shape, std::vector<float>(n), std::vector<float>(n, 0.0f), std::vector<float>(n, 0.0f)};
    for (float& x : p.w) x = init(rng);
    model.push_back(std::move(p));
  }
  return model;
}

// One AdamW step with a random gradient: every element of every tensor moves.
void AdamWStep(std::vector<Param>& model, int t, std::mt19937_64& rng) {
  constexpr float kLr = 1e-3f, kB1 = 0.9f, kB2 = 0.999f, kEps = 1e-8f, kWd = 0.01f;
  std::normal_distribution<float> grad(0.0f, 1e-2f);
  const float c1 = 1.0f - std::pow(kB1, static_cast<float>(t));
  const float c2 = 1.0f - std::pow(kB2, static_cast<float>(t));
  for (Param& p : model) {
    for (size_t i = 0; i < p.w.size(); ++i) {
      const float g = grad(rng) + 0.1f * p.w[i];
      p.m[i] = kB1 * p.m[i] + (1 - kB1) * g;
      p.v[i] = kB2 * p.v[i] + (1 - kB2) * g * g;
      p.w[i] -= kLr * ((p.m[i] / c1) / (std::sqrt(p.v[i] / c2) + kEps) + kWd * p.w[i]);
    }
  }
}

ckpt::TensorView View(const std::string& name, const std::vector<int64_t>& shape, const std::vector<float>& v) {
  ckpt::TensorView view;
  view.name = name;
  view.dtype = ckpt::DType::kFloat32;
  view.shape = shape;
  view.data = v.data();
  view.nbytes = v.size() * sizeof(float);
  return view;
}

std::vector<ckpt::TensorView> Views(const std::vector<Param>& model) {
  std::vector<ckpt::TensorView> views;
  for (const Param& p : model) {
    views.push_back(View(p.name, p.shape, p.w));
    views.push_back(View("opt." + p.name + ".exp_avg", p.shape, p.m));
    views.push_back(View("opt." + p.name + ".exp_avg_sq", p.shape, p.v));
  }
  return views;
}

struct Timed {
  double seconds = 0;
  uint64_t bytes_read = 0;
};

// Opens step `step`, reads every tensor, checks them against `want`.
Timed Restore(const std::string& root, int64_t step, const std::vector<ckpt::TensorView>& want, bool verify) {
  ckpt::ReaderOptions options;
  options.step = step;
  const Clock::time_point start = Clock::now();
  auto reader = ckpt::Reader::Open(root, options);
  if (!reader.ok()) ckpt::bench::Die(std::string(reader.status().ToString()));
  Timed timed;
  if (verify) {
    absl::Status s = (*reader)->Verify();
    if (!s.ok()) ckpt::bench::Die(std::string(s.ToString()));
    timed.seconds = SecondsSince(start);
    timed.bytes_read = (*reader)->bytes_read();
    return timed;
  }
  auto all = (*reader)->ReadAll();
  if (!all.ok()) ckpt::bench::Die(std::string(all.status().ToString()));
  timed.seconds = SecondsSince(start);
  timed.bytes_read = (*reader)->bytes_read();
  for (size_t i = 0; i < want.size(); ++i) {
    const ckpt::Tensor& t = (*all)[i];
    if (t.name != want[i].name || t.nbytes() != want[i].nbytes ||
        std::memcmp(t.data(), want[i].data, t.nbytes()) != 0) {
      ckpt::bench::Die(absl::StrCat("step ", step, ": tensor ", want[i].name, " restored wrong"));
    }
  }
  return timed;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string dir = absl::GetFlag(FLAGS_dir);
  if (dir.empty()) ckpt::bench::Die("--dir is required");
  // The engine creates its root, not the root's parents: --dir may be new
  // (run_all.sh passes $CKPT_BENCH_DIR/run.XXXXXX/chain_restore).
  std::error_code made;
  std::filesystem::create_directories(dir, made);
  if (made) ckpt::bench::Die(absl::StrCat("cannot create ", dir, ": ", made.message()));
  const int saves = absl::GetFlag(FLAGS_saves);
  const int reps = absl::GetFlag(FLAGS_reps);
  const std::vector<std::string> bases = absl::StrSplit(absl::GetFlag(FLAGS_bases), ',');
  for (const std::string& base : bases) {
    std::mt19937_64 rng(16);
    std::vector<Param> model = MakeModel(absl::GetFlag(FLAGS_hidden), absl::GetFlag(FLAGS_layers), rng);
    int t = 0;
    while (t < absl::GetFlag(FLAGS_warmup)) AdamWStep(model, ++t, rng);
    const std::string root = absl::StrCat(dir, "/chain-", base);
    ckpt::bench::RemoveAndSettle(root);
    ckpt::EngineOptions options;
    options.delta.mode = ckpt::DeltaOptions::Mode::kExact;
    options.delta.full_every = saves;
    options.delta.max_restore_read_factor = 0;
    options.delta.base = base == "differential" ? ckpt::DeltaOptions::Base::kDifferential
                                                : ckpt::DeltaOptions::Base::kChained;
    auto engine = ckpt::Engine::Open(root, options);
    if (!engine.ok()) ckpt::bench::Die(std::string(engine.status().ToString()));
    uint64_t full_bytes = 0, delta_bytes = 0, state_bytes = 0;
    int deltas = 0;
    for (int s = 1; s <= saves; ++s) {
      if (s > 1) AdamWStep(model, ++t, rng);
      auto stats = (*engine)->Save(s, Views(model));
      if (!stats.ok()) ckpt::bench::Die(std::string(stats.status().ToString()));
      state_bytes = stats->tensor_bytes;
      if (stats->kind == ckpt::CheckpointKind::kFull) {
        full_bytes = stats->file_bytes;
      } else {
        delta_bytes += stats->file_bytes;
        ++deltas;
      }
    }
    if (!(*engine)->Close().ok()) ckpt::bench::Die("close failed");
    const std::vector<ckpt::TensorView> now = Views(model);
    // The full checkpoint's values: the model as it was at save 1.
    std::mt19937_64 replay(16);
    std::vector<Param> at_first = MakeModel(absl::GetFlag(FLAGS_hidden), absl::GetFlag(FLAGS_layers), replay);
    for (int u = 1; u <= absl::GetFlag(FLAGS_warmup); ++u) AdamWStep(at_first, u, replay);
    const std::vector<ckpt::TensorView> then = Views(at_first);

    std::vector<double> full_s, chain_s, verify_s, ratios;
    Timed full, chain, verify;
    for (int r = 0; r < reps; ++r) {
      full = Restore(root, 1, then, false);
      chain = Restore(root, saves, now, false);
      verify = Restore(root, saves, now, true);
      full_s.push_back(full.seconds);
      chain_s.push_back(chain.seconds);
      verify_s.push_back(verify.seconds);
      // MB/s of the chain over the full's, in this repetition.
      ratios.push_back((double(chain.bytes_read) / chain.seconds) / (double(full.bytes_read) / full.seconds));
    }
    full.seconds = Median(full_s);
    chain.seconds = Median(chain_s);
    verify.seconds = Median(verify_s);
    const double full_mbps = full.bytes_read / full.seconds / 1e6;
    const double chain_mbps = chain.bytes_read / chain.seconds / 1e6;
    nlohmann::ordered_json line;
    line["bench"] = "chain_restore";
    line["base"] = base;
    line["state_bytes"] = state_bytes;
    line["tensors"] = now.size();
    line["deltas"] = deltas;
    line["delta_over_full"] = Round(deltas > 0 ? double(delta_bytes) / deltas / full_bytes : 0);
    line["full_restore_s"] = Round(full.seconds);
    line["chain_restore_s"] = Round(chain.seconds);
    line["chain_verify_s"] = Round(verify.seconds);
    line["full_read_bytes"] = full.bytes_read;
    line["chain_read_bytes"] = chain.bytes_read;
    line["chain_read_over_full"] = Round(double(chain.bytes_read) / full.bytes_read);
    line["full_mbps"] = Round(full_mbps);
    line["chain_mbps"] = Round(chain_mbps);
    line["chain_over_full_mbps"] = Round(chain_mbps / full_mbps);
    line["chain_over_full_mbps_median_of_pairs"] = Round(Median(ratios));
    std::printf("%s\n", line.dump().c_str());
    std::fflush(stdout);
  }
  return 0;
}
