#include "bench_common.h"

#include "ckpt/file_system.h"

#include <unistd.h>

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

void RemoveAndSettle(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  ::sync();
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

uint64_t TotalBytes(const std::vector<Spec>& specs) {
  uint64_t n = 0;
  for (const Spec& s : specs) n += s.bytes();
  return n;
}

// Lays `specs` out at 4 KiB-aligned offsets of one pre-faulted allocation
// filled with splitmix64 output (cheap, non-repeating: incompressible, like
// trained weights).
State Materialize(const std::vector<Spec>& specs) {
  uint64_t total = 0;
  for (const Spec& s : specs) total += AlignUp(s.bytes());
  const Clock::time_point start = Clock::now();
  State state;
  auto memory = AlignedBytes::Allocate(total, /*prefault=*/true);
  if (!memory.ok()) Die(std::string(memory.status().ToString()));
  state.memory = std::move(*memory);
  char* base = static_cast<char*>(state.memory.data());
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (uint64_t i = 0; i + 8 <= total; i += 8) {
    uint64_t z = (x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    std::memcpy(base + i, &z, 8);
  }
  uint64_t offset = 0;
  for (const Spec& s : specs) {
    const uint64_t n = s.bytes();
    // Padding between tensors stays zero.
    std::memset(base + offset + n, 0, AlignUp(n) - n);
    state.views.push_back(TensorView{s.name, s.dtype, s.shape, base + offset, n});
    offset += AlignUp(n);
  }
  Log("state", absl::StrCat(state.views.size(), " tensors, ", state.bytes(), " bytes (", total,
                            " allocated), filled in ", Round(SecondsSince(start)), " s"));
  return state;
}

// The transformer-like tensors for hidden size `h` (see MakeTransformerState),
// without the blob.
std::vector<Spec> TransformerSpecs(int64_t h, int layers, int buffers) {
  const int64_t vocab = 8 * h, ff = 4 * h;
  std::vector<Spec> specs;
  specs.push_back({"model.embed_tokens.weight", DType::kFloat32, {vocab, h}});
  for (int i = 0; i < layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    specs.push_back({p + "input_layernorm.weight", DType::kFloat32, {h}});
    for (const char* m : {"q", "k", "v", "o"}) {
      specs.push_back({absl::StrCat(p, "self_attn.", m, "_proj.weight"), DType::kBFloat16, {h, h}});
    }
    for (const char* m : {"q", "k", "v"}) {
      specs.push_back({absl::StrCat(p, "self_attn.", m, "_proj.bias"), DType::kFloat32, {h}});
    }
    specs.push_back({p + "post_attention_layernorm.weight", DType::kFloat32, {h}});
    specs.push_back({p + "mlp.gate_proj.weight", DType::kBFloat16, {ff, h}});
    specs.push_back({p + "mlp.up_proj.weight", DType::kBFloat16, {ff, h}});
    specs.push_back({p + "mlp.down_proj.weight", DType::kBFloat16, {h, ff}});
  }
  specs.push_back({"model.norm.weight", DType::kFloat32, {h}});
  specs.push_back({"lm_head.weight", DType::kBFloat16, {vocab, h}});
  for (int j = 1; j <= buffers; ++j) {
    specs.push_back({absl::StrCat("model.buffers.b", j), DType::kFloat32, {h / 2}});
  }
  return specs;
}

}  // namespace

State MakeTransformerState(uint64_t bytes, int tensors) {
  if (tensors < 4) Die(absl::StrCat("a transformer-like state needs >= 4 tensors, not ", tensors));
  // embedding + 12 per layer + final norm + lm_head + buffers + blob.
  const int layers = (tensors - 4) / 12;
  const int buffers = tensors - 4 - 12 * layers;
  auto total = [&](int64_t h) { return TotalBytes(TransformerSpecs(h, layers, buffers)); };
  // The largest h (a multiple of 16) whose tensors leave room for a blob of
  // at least one byte: total(lo) < bytes <= total(hi).
  int64_t lo = 16;
  if (total(lo) >= bytes) {
    Die(absl::StrCat("a transformer-like state of ", tensors, " tensors needs more than ",
                     total(lo), " bytes, not ", bytes));
  }
  int64_t hi = 32;
  while (total(hi) < bytes) hi *= 2;
  while (hi - lo > 16) {
    const int64_t mid = (lo + hi) / 2 / 16 * 16;
    (total(mid) < bytes ? lo : hi) = mid;
  }
  std::vector<Spec> specs = TransformerSpecs(lo, layers, buffers);
  const int64_t rest = static_cast<int64_t>(bytes - TotalBytes(specs));
  specs.push_back({"extra_state.blob", DType::kUInt8, {rest}});
  Log("state", absl::StrCat("transformer-like: ", layers, " layers, hidden ", lo, ", blob ", rest,
                            " bytes"));
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
  RemoveAndSettle(dir);
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
  RemoveAndSettle(dir);
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
