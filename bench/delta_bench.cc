// delta_bench: bytes written per delta vs a full save, blocked time of a
// delta save vs a full one, and restore time of a 10-delta chain vs one full
// checkpoint — for exact and top-k deltas at several change rates, in one run.
// Prints one JSON line per (mode, changed fraction):
// {"bench": "delta", "mode", "changed_frac", "delta_bytes_over_full", "blocked_s",
//  "full_blocked_s", "chain_restore_s", "full_restore_s", ...}
// First, one "codec" line per dtype (fp32, bf16): the record codecs alone on
// an AdamW-like state (bench/README.md, "codec").
#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
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
#include "delta/delta_codec.h"
#include "testing/codec_testing.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, dir, "", "Directory to write under (required).");
ABSL_FLAG(uint64_t, bytes, 1ull << 30, "Bytes of the fp32 state.");
ABSL_FLAG(int, tensors, 64, "Tensors in the state.");
ABSL_FLAG(int, chain, 10, "Deltas per chain.");
ABSL_FLAG(std::string, fractions, "0.001,0.01,0.1", "Changed fractions to measure.");
ABSL_FLAG(uint64_t, codec_bytes, 256ull << 20, "Bytes of each dtype's state in the codec line (0: none).");
ABSL_FLAG(int, codec_level, 1, "zstd level of the codec line (the engine's delta level is 1).");

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

double ThreadCpuSeconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// Best of `reps` timed runs of fn, after one untimed run (which grows the
// codec's per-thread scratch and recycled output: the steady state of a
// training run's saves, not the first save's page faults). Thread CPU time:
// the figure is per core, whatever else the machine runs.
template <typename Fn>
double BestCpuSeconds(int reps, Fn fn) {
  fn();
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const double start = ThreadCpuSeconds();
    fn();
    best = std::min(best, ThreadCpuSeconds() - start);
  }
  return best;
}

// An AdamW-like state of one dtype: per parameter a weight ~N(0, 0.02), an
// exp_avg and a positive, small exp_avg_sq; `Step` is one optimizer step
// (update ~1e-3 relative, both moments move). Values are computed in fp32
// and stored as fp32 or (rounded) bf16.
struct AdamState {
  std::vector<std::vector<char>> tensors;  // weight, exp_avg, exp_avg_sq
};

void Store(float f, bool bf16, char* at) {
  if (!bf16) {
    std::memcpy(at, &f, 4);
    return;
  }
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7FFF + ((u >> 16) & 1);  // round to nearest even
  const uint16_t b = static_cast<uint16_t>(u >> 16);
  std::memcpy(at, &b, 2);
}

std::pair<AdamState, AdamState> MakeAdamStep(uint64_t bytes, bool bf16) {
  const size_t elem = bf16 ? 2 : 4;
  const size_t numel = bytes / 3 / elem;
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  AdamState a, b;
  for (int t = 0; t < 3; ++t) {
    a.tensors.emplace_back(numel * elem);
    b.tensors.emplace_back(numel * elem);
  }
  for (size_t i = 0; i < numel; ++i) {
    const float g0 = 0.01f * normal(rng), g1 = 0.01f * normal(rng);
    const float w0 = 0.02f * normal(rng);
    const float m0 = 0.1f * g0, v0 = 0.001f * g0 * g0 + 1e-12f;
    const float m1 = 0.9f * m0 + 0.1f * g1, v1 = 0.999f * v0 + 0.001f * g1 * g1;
    const float w1 = w0 - 1e-3f * 0.02f * m1 / (std::sqrt(v1) + 1e-8f) - 1e-5f * w0;
    const float av[3] = {w0, m0, v0}, bv[3] = {w1, m1, v1};
    for (int t = 0; t < 3; ++t) {
      Store(av[t], bf16, a.tensors[t].data() + i * elem);
      Store(bv[t], bf16, b.tensors[t].data() + i * elem);
    }
  }
  return {std::move(a), std::move(b)};
}

// The "codec" line of one dtype: planes (full records), xor_planes deltas
// (what EncodeExactDelta picks for this state) and plain xor, one thread.
void CodecBench(uint64_t bytes, bool bf16, int level) {
  const ckpt::DType dtype = bf16 ? ckpt::DType::kBFloat16 : ckpt::DType::kFloat32;
  auto [a, b] = MakeAdamStep(bytes, bf16);
  double raw = 0, planes = 0, xor_planes = 0, xor_bytes = 0;
  double planes_enc = 0, planes_dec = 0, delta_enc = 0, delta_dec = 0, xor_enc = 0, xor_dec = 0;
  std::map<std::string, int> picked;
  for (int t = 0; t < 3; ++t) {
    const std::vector<char>& x = b.tensors[t];
    const std::vector<char>& r0 = a.tensors[t];
    const size_t n = x.size();
    const ckpt::internal::Piece piece{x.data(), n};
    std::vector<char> ref = r0, dst = r0;  // pre-faulted
    raw += static_cast<double>(n);
    std::vector<char> payload;
    planes_enc += BestCpuSeconds(2, [&] {
      ckpt::internal::RecycleDeltaBytes(std::move(payload));
      payload = *ckpt::internal::EncodePlanesRecord({&piece, 1}, n, dtype, level);
    });
    planes += static_cast<double>(payload.size());
    planes_dec += BestCpuSeconds(2, [&] {
      if (!ckpt::internal::DecodePlanesRecord(payload.data(), payload.size(), dst.data(), n, dtype).ok()) {
        ckpt::bench::Die("planes decode failed");
      }
    });
    if (dst != x) ckpt::bench::Die("planes round trip is not exact");
    // What resetting dst to R costs, subtracted from the apply timings.
    const double reset = BestCpuSeconds(2, [&] { std::memcpy(dst.data(), r0.data(), n); });
    ckpt::internal::DeltaRecord record;
    double encode_total = 0;
    (void)BestCpuSeconds(2, [&] {
      std::memcpy(ref.data(), r0.data(), n);  // untimed below: subtracted
      const double start = ThreadCpuSeconds();
      ckpt::internal::RecycleDeltaBytes(std::move(record.bytes));
      record = *ckpt::internal::EncodeExactDelta({&piece, 1}, ref.data(), n, dtype, level);
      encode_total = encode_total == 0 ? ThreadCpuSeconds() - start
                                       : std::min(encode_total, ThreadCpuSeconds() - start);
    });
    delta_enc += encode_total;
    picked[std::string(ckpt::RecordEncodingName(record.encoding))]++;
    xor_planes += static_cast<double>(record.bytes.size());
    delta_dec += BestCpuSeconds(2, [&] {
      std::memcpy(dst.data(), r0.data(), n);
      if (!ckpt::internal::ApplyDelta(record.encoding, record.bytes.data(), record.bytes.size(),
                                      dst.data(), n, dtype).ok()) {
        ckpt::bench::Die("delta apply failed");
      }
    }) - reset;
    if (dst != x) ckpt::bench::Die("delta round trip is not exact");
    std::vector<char> plain;
    xor_enc += BestCpuSeconds(2, [&] {
      ckpt::internal::RecycleDeltaBytes(std::move(plain));
      plain = *ckpt::internal::EncodeXorDelta({&piece, 1}, r0.data(), n, level);
    });
    xor_bytes += static_cast<double>(plain.size());
    xor_dec += BestCpuSeconds(2, [&] {
      std::memcpy(dst.data(), r0.data(), n);
      if (!ckpt::internal::ApplyDelta(ckpt::RecordEncoding::kXor, plain.data(), plain.size(),
                                      dst.data(), n, dtype).ok()) {
        ckpt::bench::Die("xor apply failed");
      }
    }) - reset;
    ckpt::internal::RecycleDeltaBytes(std::move(plain));
  }
  auto gbps = [&](double seconds) { return Round(raw / std::max(seconds, 1e-9) / 1e9); };
  nlohmann::ordered_json line;
  line["bench"] = "codec";
  line["dtype"] = bf16 ? "bf16" : "fp32";
  line["bytes"] = raw;
  line["zstd_level"] = level;
  line["planes_over_raw"] = Round(planes / raw);
  line["planes_encode_gbps_per_core"] = gbps(planes_enc);
  line["planes_decode_gbps_per_core"] = gbps(planes_dec);
  line["delta_over_raw"] = Round(xor_planes / raw);
  line["delta_encodings"] = picked;
  line["delta_encode_gbps_per_core"] = gbps(delta_enc);
  line["delta_decode_gbps_per_core"] = gbps(delta_dec);
  line["xor_over_raw"] = Round(xor_bytes / raw);
  line["xor_encode_gbps_per_core"] = gbps(xor_enc);
  line["xor_decode_gbps_per_core"] = gbps(xor_dec);
  std::cout << line.dump() << std::endl;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string dir = absl::GetFlag(FLAGS_dir);
  if (dir.empty()) ckpt::bench::Die("--dir is required");
  std::filesystem::create_directories(dir);
  if (const uint64_t codec_bytes = absl::GetFlag(FLAGS_codec_bytes); codec_bytes > 0) {
    for (bool bf16 : {false, true}) CodecBench(codec_bytes, bf16, absl::GetFlag(FLAGS_codec_level));
  }
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
