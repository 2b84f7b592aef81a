#include "bench_common.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace ckpt::bench {

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

double Round(double x) { return std::round(x * 10000) / 10000; }

void Log(const std::string& bench, const std::string& line) {
  std::cerr << "[" << bench << "] " << line << std::endl;
}

void Die(const std::string& line) {
  std::cerr << "FATAL: " << line << std::endl;
  std::exit(1);
}

uint64_t State::bytes() const {
  uint64_t n = 0;
  for (const TensorView& v : views) n += v.nbytes;
  return n;
}

namespace {

struct Spec {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t bytes() const {
    uint64_t n = DTypeSize(dtype);
    for (int64_t d : shape) n *= static_cast<uint64_t>(d);
    return n;
  }
};

State Materialize(const std::vector<Spec>& specs) {
  uint64_t total = 0;
  for (const Spec& s : specs) total += (s.bytes() + 63) / 64 * 64;
  State state;
  auto memory = AlignedBytes::Allocate(total, /*prefault=*/true);
  if (!memory.ok()) Die(std::string(memory.status().ToString()));
  state.memory = std::move(*memory);
  char* p = static_cast<char*>(state.memory.data());
  uint64_t seed = 0x9E3779B97F4A7C15ull;
  for (const Spec& s : specs) {
    const uint64_t n = s.bytes();
    // Cheap, non-repeating contents (incompressible, like trained weights).
    for (uint64_t i = 0; i + 8 <= n; i += 8) {
      seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
      std::memcpy(p + i, &seed, 8);
    }
    state.views.push_back(TensorView{s.name, s.dtype, s.shape, p, n});
    p += (n + 63) / 64 * 64;
  }
  return state;
}

}  // namespace

State MakeTransformerState(uint64_t bytes, int tensors) {
  // Per layer: qkv, o, up, down (bf16 weights, 4h^2 + ... ) and two norms.
  const int per_layer = 6;
  const int layers = std::max(1, (tensors - 2) / per_layer);
  // Bytes per layer ~ 2 * (3h^2 + h^2 + 4h^2 + 4h^2) = 24 h^2 (bf16).
  const double h2 = static_cast<double>(bytes) / (layers * 24.0 + 2 * 8.0);
  const int64_t h = std::max<int64_t>(64, static_cast<int64_t>(std::sqrt(h2)) / 64 * 64);
  std::vector<Spec> specs;
  specs.push_back({"model.embed_tokens.weight", DType::kFloat32, {4 * h, h}});
  for (int l = 0; l < layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    specs.push_back({p + "self_attn.qkv_proj.weight", DType::kBFloat16, {3 * h, h}});
    specs.push_back({p + "self_attn.o_proj.weight", DType::kBFloat16, {h, h}});
    specs.push_back({p + "mlp.up_proj.weight", DType::kBFloat16, {4 * h, h}});
    specs.push_back({p + "mlp.down_proj.weight", DType::kBFloat16, {h, 4 * h}});
    specs.push_back({p + "input_layernorm.weight", DType::kFloat32, {h}});
    specs.push_back({p + "post_attention_layernorm.weight", DType::kFloat32, {h}});
  }
  specs.push_back({"model.norm.weight", DType::kFloat32, {h}});
  return Materialize(specs);
}

State MakeUniformState(uint64_t bytes, int tensors) {
  const int64_t elements = std::max<int64_t>(1, static_cast<int64_t>(bytes / 4 / tensors));
  std::vector<Spec> specs;
  for (int i = 0; i < tensors; ++i) {
    specs.push_back({absl::StrCat("blocks.", i / 10, ".p", i % 10), DType::kFloat32, {elements}});
  }
  return Materialize(specs);
}

FioResult RunFio(const std::string& fio, const std::string& dir, uint64_t bytes, uint64_t block,
                 int depth, bool read) {
  FioResult result;
  std::filesystem::create_directories(dir);
  const std::string file = dir + "/fio.dat";
  const std::string common = absl::StrCat(
      " --name=ckpt --filename=", file, " --size=", bytes, " --bs=", block, " --iodepth=", depth,
      " --ioengine=io_uring --direct=1 --output-format=json");
  std::string cmd = absl::StrCat(fio, common, " --rw=write --end_fsync=1");
  if (read) cmd += absl::StrCat(" && ", fio, common, " --rw=read");
  FILE* pipe = popen((cmd + " 2>/dev/null").c_str(), "r");
  std::string out;
  if (pipe != nullptr) {
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
    if (pclose(pipe) != 0) result.error = "fio failed: " + cmd;
  } else {
    result.error = "cannot run fio";
  }
  // With `read`, the second JSON document is the read.
  size_t start = read ? out.rfind("\n{") : out.find('{');
  if (result.error.empty() && start != std::string::npos) {
    auto j = nlohmann::json::parse(out.substr(start), nullptr, false);
    if (!j.is_discarded()) {
      const auto& job = j["jobs"][0][read ? "read" : "write"];
      const double bytes_moved = job["io_bytes"].get<double>();
      const double ms = job["runtime"].get<double>();
      if (ms > 0) result.gbps = bytes_moved / (ms / 1000) / 1e9;
    }
  }
  std::filesystem::remove_all(dir);
  return result;
}

std::vector<double> TorchSaveSeconds(const std::string& python, const std::string& script,
                                     const std::string& dir, const State& state, int reps,
                                     std::string* note) {
  std::filesystem::create_directories(dir);
  nlohmann::json spec = nlohmann::json::array();
  for (const TensorView& v : state.views) {
    spec.push_back({{"name", v.name}, {"dtype", std::string(DTypeName(v.dtype))}, {"shape", v.shape}});
  }
  const std::string spec_path = dir + "/spec.json";
  std::ofstream(spec_path) << spec.dump();
  const std::string cmd = absl::StrCat(python, " ", script, " --spec ", spec_path, " --dir ", dir,
                                       " --reps ", reps);
  FILE* pipe = popen(cmd.c_str(), "r");
  std::string out;
  if (pipe != nullptr) {
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
    pclose(pipe);
  }
  std::filesystem::remove_all(dir);
  std::vector<double> times;
  auto j = nlohmann::json::parse(out, nullptr, false);
  if (j.is_discarded() || !j.contains("torch_save_s") || j["torch_save_s"].is_null()) {
    *note = j.is_discarded() ? "torch.save baseline failed: " + out : j.value("skipped", "");
    return times;
  }
  for (const auto& t : j["torch_save_s"]) times.push_back(t.get<double>());
  return times;
}

}  // namespace ckpt::bench
