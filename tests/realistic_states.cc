// Realistic training states for the engine tests: generators shaped like
// real models (GPT + AdamW, mixed precision, ResNet + BatchNorm, 10,000 tiny
// tensors, one large tensor, random soups), mutators that change them the way
// training does, and the runner that saves, mutates and reads each case back
// under deadlines. (About 900 lines, over the house ~400: the generators and
// the runner share the case description and are read together; splitting the
// runner out is noted in issue 13.)
#include "realistic_states.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ckpt/catalog.h"
#include "ckpt/reader.h"
#include "format/shard_plan.h"
#include "gtest/gtest.h"

namespace ckpt::testing {
namespace {

// ---------------------------------------------------------------------------
// Element access, as the delta codec converts (fp16/bf16 widen exactly).

float HalfToFloat(uint16_t h) {
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  float v;
  if (exp == 0) v = std::ldexp(static_cast<float>(mant), -24);
  else if (exp == 31) v = mant != 0 ? std::numeric_limits<float>::quiet_NaN()
                                    : std::numeric_limits<float>::infinity();
  else v = std::ldexp(static_cast<float>(mant | 0x400), exp - 25);
  return (h & 0x8000) != 0 ? -v : v;
}

uint16_t FloatToHalf(float f) {  // round to nearest even
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  const uint32_t abs = x & 0x7fffffff;
  if (abs >= 0x7f800000) return sign | (abs > 0x7f800000 ? 0x7e00 : 0x7c00);
  if (abs >= 0x477ff000) return sign | 0x7c00;  // rounds past 65504
  if (abs < 0x38800000) {  // half subnormal (or zero): a multiple of 2^-24
    return sign | static_cast<uint16_t>(std::nearbyint(std::bit_cast<float>(abs) * 16777216.0f));
  }
  uint32_t h = ((((abs >> 23) - 127 + 15)) << 10) | ((abs & 0x7fffff) >> 13);
  const uint32_t rest = abs & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1) != 0)) ++h;
  return static_cast<uint16_t>(sign | h);
}

uint16_t FloatToBFloat16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((x >> 16) | 0x40);
  return static_cast<uint16_t>((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

template <typename T>
T LoadAs(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

double Load(const uint8_t* p, DType dtype) {
  switch (dtype) {
    case DType::kBool: return *p != 0 ? 1 : 0;
    case DType::kUInt8: return *p;
    case DType::kInt8: return LoadAs<int8_t>(p);
    case DType::kInt16: return LoadAs<int16_t>(p);
    case DType::kInt32: return LoadAs<int32_t>(p);
    case DType::kInt64: return static_cast<double>(LoadAs<int64_t>(p));
    case DType::kUInt16: return LoadAs<uint16_t>(p);
    case DType::kUInt32: return LoadAs<uint32_t>(p);
    case DType::kUInt64: return static_cast<double>(LoadAs<uint64_t>(p));
    case DType::kFloat16: return HalfToFloat(LoadAs<uint16_t>(p));
    case DType::kBFloat16: return std::bit_cast<float>(uint32_t{LoadAs<uint16_t>(p)} << 16);
    case DType::kFloat32: return LoadAs<float>(p);
    case DType::kFloat64: return LoadAs<double>(p);
  }
  return 0;
}

template <typename T>
void StoreInt(uint8_t* p, double v) {
  // (64-bit limits are not doubles: stay well inside them.)
  const double lo = std::max(static_cast<double>(std::numeric_limits<T>::min()), -0x1p62);
  const double hi = std::min(static_cast<double>(std::numeric_limits<T>::max()), 0x1p62);
  const T t = static_cast<T>(std::clamp(std::nearbyint(v), lo, hi));
  std::memcpy(p, &t, sizeof(T));
}

void Store(uint8_t* p, DType dtype, double v) {
  uint16_t h;
  float f;
  switch (dtype) {
    case DType::kBool: *p = v != 0 ? 1 : 0; return;
    case DType::kUInt8: return StoreInt<uint8_t>(p, v);
    case DType::kInt8: return StoreInt<int8_t>(p, v);
    case DType::kInt16: return StoreInt<int16_t>(p, v);
    case DType::kInt32: return StoreInt<int32_t>(p, v);
    case DType::kInt64: return StoreInt<int64_t>(p, v);
    case DType::kUInt16: return StoreInt<uint16_t>(p, v);
    case DType::kUInt32: return StoreInt<uint32_t>(p, v);
    case DType::kUInt64: return StoreInt<uint64_t>(p, v);
    case DType::kFloat16: h = FloatToHalf(static_cast<float>(v)); std::memcpy(p, &h, 2); return;
    case DType::kBFloat16: h = FloatToBFloat16(static_cast<float>(v)); std::memcpy(p, &h, 2); return;
    case DType::kFloat32: f = static_cast<float>(v); std::memcpy(p, &f, 4); return;
    case DType::kFloat64: std::memcpy(p, &v, 8); return;
  }
}

// ---------------------------------------------------------------------------
// Values and their changes, by role.

double Normal(std::mt19937_64& rng, double sigma) {
  return std::normal_distribution<double>(0.0, sigma)(rng);
}

double Initial(Role role, DType dtype, std::mt19937_64& rng) {
  switch (role) {
    case Role::kWeight: return Normal(rng, 0.02);
    case Role::kNormWeight: return 1 + Normal(rng, 0.01);
    case Role::kExpAvg: return Normal(rng, 1e-3);
    case Role::kExpAvgSq: { const double g = Normal(rng, 1e-3); return g * g; }
    case Role::kMomentum: return Normal(rng, 1e-2);
    case Role::kStep: return 100;
    case Role::kRunningMean: return Normal(rng, 0.1);
    case Role::kRunningVar: return 1 + std::fabs(Normal(rng, 0.1));
    case Role::kCounter: return 5000;
    case Role::kBuffer: return 1;
    case Role::kMisc: break;
  }
  if (IsFloatingDType(dtype)) return Normal(rng, 1.0);
  return static_cast<double>(rng() % 200);
}

// One training update of one element.
double Updated(Role role, DType dtype, double x, std::mt19937_64& rng) {
  switch (role) {
    case Role::kWeight:
    case Role::kNormWeight: return x + Normal(rng, 1e-3);
    case Role::kExpAvg: return 0.9 * x + 0.1 * Normal(rng, 1e-2);
    case Role::kExpAvgSq: { const double g = Normal(rng, 1e-2); return 0.999 * x + 0.001 * g * g; }
    case Role::kMomentum: return 0.9 * x + Normal(rng, 1e-2);
    case Role::kStep: return x + 1;
    case Role::kRunningMean: return 0.9 * x + 0.1 * Normal(rng, 0.1);
    case Role::kRunningVar: return 0.9 * x + 0.1 * (1 + std::fabs(Normal(rng, 0.1)));
    case Role::kCounter: return x + 10;
    case Role::kBuffer: return x;
    case Role::kMisc: break;
  }
  if (IsFloatingDType(dtype)) return x + Normal(rng, 1e-2);
  if (dtype == DType::kBool) return rng() % 10 == 0 ? 1 - x : x;
  return rng() % 3 == 0 ? static_cast<double>(rng() % 200) : x;
}

void UpdateElements(OwnedTensor& t, Role role, size_t first, size_t count, std::mt19937_64& rng) {
  const size_t size = DTypeSize(t.dtype);
  for (size_t i = first; i < first + count; ++i) {
    uint8_t* p = t.bytes.data() + i * size;
    Store(p, t.dtype, Updated(role, t.dtype, Load(p, t.dtype), rng));
  }
}

size_t Elements(const OwnedTensor& t) { return t.bytes.size() / DTypeSize(t.dtype); }

std::string Kib(uint64_t bytes) {
  if (bytes >= (uint64_t{1} << 40)) return "huge";
  if (bytes % (1 << 20) == 0 && bytes > 0) return absl::StrCat(bytes >> 20, "M");
  if (bytes % 1024 == 0) return absl::StrCat(bytes >> 10, "K");
  return absl::StrCat(bytes, "B");
}

std::vector<TensorView> ShapeOnlyViews(const StateLayout& layout) {
  std::vector<TensorView> views;
  for (const TensorSpec& t : layout.tensors) {
    views.push_back(TensorView{t.name, t.dtype, t.shape, nullptr, t.bytes()});
  }
  return views;
}

template <typename T>
T Pick(std::mt19937_64& rng, std::initializer_list<T> values) {
  return *(values.begin() + rng() % values.size());
}

}  // namespace

// ---------------------------------------------------------------------------
// Deadlines.

absl::Duration CaseDeadline() {
  const char* env = std::getenv("CKPT_CASE_DEADLINE_S");
  const double seconds = env != nullptr ? std::atof(env) : 0;
  return seconds > 0 ? absl::Seconds(seconds) : absl::Seconds(60);
}

Deadline::Deadline(std::string what, absl::Duration limit) {
  const absl::Time start = absl::Now();
  thread_ = std::thread([this, what = std::move(what), limit, start] {
    std::unique_lock<std::mutex> lock(mu_);
    if (cv_.wait_for(lock, absl::ToChronoMilliseconds(limit), [this] { return done_; })) return;
    const std::string message =
        absl::StrCat("HUNG: ", what, " did not return within ",
                     absl::FormatDuration(absl::Now() - start), "; aborting the test binary");
    ADD_FAILURE() << message;
    std::fprintf(stderr, "[  HUNG    ] %s\n", message.c_str());
    std::fflush(stdout);
    std::fflush(stderr);
    std::abort();
  });
}

Deadline::~Deadline() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

absl::Status WaitWithDeadline(SaveHandle& handle, absl::Duration limit, const std::string& what) {
  Deadline deadline(what, limit);
  return handle.Wait();
}

// ---------------------------------------------------------------------------
// Layouts.

uint64_t TensorSpec::bytes() const {
  uint64_t n = DTypeSize(dtype);
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

uint64_t StateLayout::bytes() const {
  uint64_t n = 0;
  for (const TensorSpec& t : tensors) n += t.bytes();
  return n;
}

uint64_t StateLayout::largest() const {
  uint64_t n = 0;
  for (const TensorSpec& t : tensors) n = std::max(n, t.bytes());
  return n;
}

size_t StateLayout::Shards(uint64_t shard_min_bytes, uint64_t shard_max_bytes) const {
  return internal::PlanShards(ShapeOnlyViews(*this), shard_min_bytes, shard_max_bytes).size();
}

size_t StateLayout::Chunks(uint64_t shard_min_bytes, uint64_t shard_max_bytes,
                           size_t chunk_bytes) const {
  size_t n = 0;
  for (const auto& s : internal::PlanShards(ShapeOnlyViews(*this), shard_min_bytes, shard_max_bytes)) {
    n += (s.padded_bytes + chunk_bytes - 1) / chunk_bytes;
  }
  return n;
}

StateLayout GptLayout(const GptConfig& c) {
  StateLayout layout;
  layout.description = absl::StrCat("gpt(vocab=", c.vocab, ",d=", c.d_model, ",layers=", c.layers,
                                    ",ctx=", c.context, c.mixed ? ",bf16/fp16/fp32" : ",fp32",
                                    c.optimizer ? ",adamw)" : ")");
  const DType w = c.mixed ? DType::kBFloat16 : DType::kFloat32;
  const DType head = c.mixed ? DType::kFloat16 : DType::kFloat32;
  const DType norm = DType::kFloat32;
  const int64_t d = c.d_model;
  std::vector<size_t> params;
  auto add = [&](std::string name, DType dtype, std::vector<int64_t> shape, Role role) {
    if (role != Role::kBuffer) params.push_back(layout.tensors.size());
    layout.tensors.push_back(TensorSpec{std::move(name), dtype, std::move(shape), role});
  };
  add("model.transformer.wte.weight", w, {c.vocab, d}, Role::kWeight);
  add("model.transformer.wpe.weight", w, {c.context, d}, Role::kWeight);
  for (int64_t l = 0; l < c.layers; ++l) {
    const std::string p = absl::StrCat("model.transformer.h.", l, ".");
    add(p + "ln_1.weight", norm, {d}, Role::kNormWeight);
    add(p + "ln_1.bias", norm, {d}, Role::kWeight);
    add(p + "attn.bias", DType::kBool, {1, 1, c.context, c.context}, Role::kBuffer);
    add(p + "attn.c_attn.weight", w, {3 * d, d}, Role::kWeight);
    add(p + "attn.c_attn.bias", w, {3 * d}, Role::kWeight);
    add(p + "attn.c_proj.weight", w, {d, d}, Role::kWeight);
    add(p + "attn.c_proj.bias", w, {d}, Role::kWeight);
    add(p + "ln_2.weight", norm, {d}, Role::kNormWeight);
    add(p + "ln_2.bias", norm, {d}, Role::kWeight);
    add(p + "mlp.c_fc.weight", w, {4 * d, d}, Role::kWeight);
    add(p + "mlp.c_fc.bias", w, {4 * d}, Role::kWeight);
    add(p + "mlp.c_proj.weight", w, {d, 4 * d}, Role::kWeight);
    add(p + "mlp.c_proj.bias", w, {d}, Role::kWeight);
  }
  add("model.transformer.ln_f.weight", norm, {d}, Role::kNormWeight);
  add("model.transformer.ln_f.bias", norm, {d}, Role::kWeight);
  add("model.lm_head.weight", head, {c.vocab, d}, Role::kWeight);
  layout.embedding_group = {0};
  if (c.optimizer) {
    const std::vector<size_t> trained = params;
    for (size_t i = 0; i < trained.size(); ++i) {
      const TensorSpec param = layout.tensors[trained[i]];
      const std::string p = absl::StrCat("optim.state.", i, ".");
      if (i == 0) {
        for (size_t k = 0; k < 3; ++k) layout.embedding_group.push_back(layout.tensors.size() + k);
      }
      layout.tensors.push_back(TensorSpec{p + "step", DType::kFloat32, {}, Role::kStep});
      layout.tensors.push_back(TensorSpec{p + "exp_avg", DType::kFloat32, param.shape, Role::kExpAvg});
      layout.tensors.push_back(
          TensorSpec{p + "exp_avg_sq", DType::kFloat32, param.shape, Role::kExpAvgSq});
    }
  }
  if (c.mixed) {
    layout.tensors.push_back(TensorSpec{"scaler.scale", DType::kFloat32, {}, Role::kMisc});
    layout.tensors.push_back(TensorSpec{"scaler.growth_tracker", DType::kInt32, {}, Role::kCounter});
  }
  return layout;
}

StateLayout ResNetLayout(const ResNetConfig& c) {
  StateLayout layout;
  layout.description = absl::StrCat("resnet(width=", c.width, ",stages=", c.stages, ",classes=",
                                    c.classes, ",", DTypeName(c.conv_dtype),
                                    c.momentum ? ",sgd)" : ")");
  std::vector<size_t> params;
  auto add = [&](std::string name, DType dtype, std::vector<int64_t> shape, Role role, bool trained) {
    if (trained) params.push_back(layout.tensors.size());
    layout.tensors.push_back(TensorSpec{std::move(name), dtype, std::move(shape), role});
  };
  auto conv = [&](const std::string& name, int64_t out, int64_t in, int64_t k) {
    add(name + ".weight", c.conv_dtype, {out, in, k, k}, Role::kWeight, true);
  };
  auto bn = [&](const std::string& name, int64_t ch) {
    add(name + ".weight", DType::kFloat32, {ch}, Role::kNormWeight, true);
    add(name + ".bias", DType::kFloat32, {ch}, Role::kWeight, true);
    add(name + ".running_mean", DType::kFloat32, {ch}, Role::kRunningMean, false);
    add(name + ".running_var", DType::kFloat32, {ch}, Role::kRunningVar, false);
    add(name + ".num_batches_tracked", DType::kInt64, {}, Role::kCounter, false);
  };
  conv("model.conv1", c.width, 3, 7);
  bn("model.bn1", c.width);
  int64_t in = c.width;
  for (int64_t s = 0; s < c.stages; ++s) {
    const int64_t out = c.width << s;
    const std::string p = absl::StrCat("model.layer", s + 1, ".0.");
    conv(p + "conv1", out, in, 3);
    bn(p + "bn1", out);
    conv(p + "conv2", out, out, 3);
    bn(p + "bn2", out);
    if (in != out) {
      conv(p + "downsample.0", out, in, 1);
      bn(p + "downsample.1", out);
    }
    in = out;
  }
  add("model.fc.weight", c.conv_dtype, {c.classes, in}, Role::kWeight, true);
  add("model.fc.bias", c.conv_dtype, {c.classes}, Role::kWeight, true);
  if (c.momentum) {
    const std::vector<size_t> trained = params;
    for (size_t i = 0; i < trained.size(); ++i) {
      const TensorSpec param = layout.tensors[trained[i]];
      layout.tensors.push_back(TensorSpec{absl::StrCat("optim.state.", i, ".momentum_buffer"),
                                          param.dtype, param.shape, Role::kMomentum});
    }
  }
  return layout;
}

StateLayout TinyTensorsLayout(size_t count) {
  StateLayout layout;
  layout.description = absl::StrCat("tiny(count=", count, ")");
  static constexpr const char* kLists[] = {"lora_A", "lora_B", "norm_scales", "expert_bias",
                                           "router_stats"};
  static constexpr DType kStats[] = {DType::kInt64, DType::kUInt8,  DType::kBool,
                                     DType::kInt8,  DType::kInt16,  DType::kInt32,
                                     DType::kUInt16, DType::kUInt32, DType::kUInt64};
  for (size_t i = 0; i < count; ++i) {
    const int64_t k = static_cast<int64_t>(i % 50);
    const size_t list = (i / 50) % 5;
    TensorSpec t;
    t.name = absl::StrCat("model.layers.", i / 250, ".", kLists[list], ".", k);
    t.role = Role::kWeight;
    switch (list) {
      case 0: t.dtype = DType::kBFloat16; t.shape = {2, 1 + k % 16}; break;
      case 1: t.dtype = DType::kFloat16; t.shape = {1 + k % 24, 2}; break;
      case 2:
        t.dtype = DType::kFloat32;
        t.role = Role::kNormWeight;
        if (k % 10 != 0) t.shape = {1 + (k * 7) % 48};  // else 0-d
        break;
      case 3: t.dtype = DType::kFloat64; t.shape = {k % 5}; break;  // 0-byte when k % 5 == 0
      default:
        t.dtype = kStats[k % 9];
        t.role = Role::kMisc;
        if (t.dtype == DType::kInt64) t.role = Role::kCounter;  // 0-d counter
        else t.shape = {k % 41};                               // 0-byte when k == 0
        break;
    }
    layout.tensors.push_back(std::move(t));
  }
  return layout;
}

StateLayout LargeTensorLayout(uint64_t large_bytes) {
  StateLayout layout;
  layout.description = absl::StrCat("large(", Kib(large_bytes), ")");
  const int64_t rows = std::max<int64_t>(1, static_cast<int64_t>(large_bytes / 512));
  layout.tensors = {
      {"model.embed_tokens.weight", DType::kBFloat16, {rows, 256}, Role::kWeight},
      {"model.layers.0.mlp.down_proj.weight", DType::kFloat32,
       {std::max<int64_t>(1, static_cast<int64_t>(large_bytes / 3 / 1024)), 256}, Role::kWeight},
      {"model.layers.0.input_layernorm.weight", DType::kFloat32, {256}, Role::kNormWeight},
      {"model.norm.weight", DType::kFloat32, {256}, Role::kNormWeight},
      {"optim.state.0.step", DType::kFloat32, {}, Role::kStep},
  };
  layout.embedding_group = {0, 4};
  return layout;
}

StateLayout ModulesLayout(size_t modules) {
  StateLayout layout;
  layout.description = absl::StrCat("modules(", modules, "x24K)");
  for (size_t i = 0; i < modules; ++i) {
    layout.tensors.push_back(
        TensorSpec{absl::StrCat("model.blocks.", i, ".weight"), DType::kFloat32, {6144}, Role::kWeight});
  }
  return layout;
}

StateLayout RandomLayout(std::mt19937_64& rng) {
  auto uniform = [&](int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo + 1));
  };
  switch (rng() % 6) {
    case 0: {
      GptConfig c;
      c.vocab = uniform(16, 3000);
      c.d_model = Pick<int64_t>(rng, {8, 16, 32, 64});
      c.layers = uniform(0, 3);
      c.context = uniform(1, 64);
      c.mixed = rng() % 2 == 0;
      c.optimizer = rng() % 4 != 0;
      return GptLayout(c);
    }
    case 1: {
      ResNetConfig c;
      c.width = uniform(1, 32);
      c.stages = uniform(1, 4);
      c.classes = uniform(1, 200);
      c.conv_dtype = Pick(rng, {DType::kFloat32, DType::kFloat16, DType::kBFloat16});
      c.momentum = rng() % 2 == 0;
      return ResNetLayout(c);
    }
    case 2: return TinyTensorsLayout(static_cast<size_t>(uniform(0, 3000)));
    case 3: return LargeTensorLayout(static_cast<uint64_t>(uniform(1, 4 << 20)));
    case 4: return ModulesLayout(static_cast<size_t>(uniform(1, 20)));
    default: break;
  }
  // A soup: any dtype, rank 0..4, dimensions 0 included, up to 200 tensors
  // (none at all one time in 20) over up to 30 modules.
  StateLayout layout;
  const size_t count = rng() % 20 == 0 ? 0 : static_cast<size_t>(uniform(1, 200));
  const int64_t modules = uniform(1, 30);
  static constexpr int64_t kMaxDim[] = {1, 5000, 200, 40, 16};
  for (size_t i = 0; i < count; ++i) {
    TensorSpec t;
    t.name = absl::StrCat("soup.m", uniform(0, modules - 1), ".t", i);
    t.dtype = static_cast<DType>(rng() % kNumDTypes);
    const int rank = static_cast<int>(rng() % 5);
    for (int r = 0; r < rank; ++r) t.shape.push_back(rng() % 20 == 0 ? 0 : uniform(1, kMaxDim[rank]));
    t.role = IsFloatingDType(t.dtype) && rng() % 2 == 0 ? Role::kWeight : Role::kMisc;
    layout.tensors.push_back(std::move(t));
  }
  layout.description = absl::StrCat("soup(count=", count, ",modules=", modules, ")");
  return layout;
}

// ---------------------------------------------------------------------------
// States and mutations.

RealisticState MakeState(StateLayout layout, uint64_t seed) {
  RealisticState state;
  state.tensors.reserve(layout.tensors.size());
  for (size_t i = 0; i < layout.tensors.size(); ++i) {
    const TensorSpec& spec = layout.tensors[i];
    OwnedTensor t{spec.name, spec.dtype, spec.shape, std::vector<uint8_t>(spec.bytes())};
    std::mt19937_64 rng(seed * 1000003 + i);
    const size_t size = DTypeSize(t.dtype);
    const size_t n = Elements(t);
    if (spec.role == Role::kBuffer && spec.shape.size() >= 2) {  // causal mask
      const size_t cols = static_cast<size_t>(spec.shape.back());
      for (size_t e = 0; e < n; ++e) Store(&t.bytes[e * size], t.dtype, e % cols <= (e / cols) % cols);
    } else {
      for (size_t e = 0; e < n; ++e) Store(&t.bytes[e * size], t.dtype, Initial(spec.role, t.dtype, rng));
    }
    state.tensors.push_back(std::move(t));
  }
  state.layout = std::move(layout);
  return state;
}

const char* MutationName(Mutation m) {
  switch (m) {
    case Mutation::kNone: return "none";
    case Mutation::kSparse: return "sparse";
    case Mutation::kDense: return "dense";
  }
  return "?";
}

void Mutate(RealisticState& state, Mutation mutation, std::mt19937_64& rng) {
  const std::vector<TensorSpec>& specs = state.layout.tensors;
  if (mutation == Mutation::kDense) {
    for (size_t i = 0; i < specs.size(); ++i) {
      UpdateElements(state.tensors[i], specs[i].role, 0, Elements(state.tensors[i]), rng);
    }
    return;
  }
  if (mutation != Mutation::kSparse || specs.empty()) return;
  const std::vector<size_t>& group = state.layout.embedding_group;
  if (!group.empty() && !specs[group[0]].shape.empty() && specs[group[0]].shape[0] > 0) {
    const int64_t rows = specs[group[0]].shape[0];
    const int64_t changed = std::max<int64_t>(1, rows / 200);
    std::vector<int64_t> picked;
    for (int64_t r = 0; r < changed; ++r) picked.push_back(static_cast<int64_t>(rng() % rows));
    for (size_t i : group) {
      OwnedTensor& t = state.tensors[i];
      if (specs[i].shape.empty()) {
        UpdateElements(t, specs[i].role, 0, 1, rng);  // its step
        continue;
      }
      const size_t row = Elements(t) / static_cast<size_t>(rows);
      for (int64_t r : picked) UpdateElements(t, specs[i].role, static_cast<size_t>(r) * row, row, rng);
    }
    return;
  }
  for (int k = 0; k < 3; ++k) {
    OwnedTensor& t = state.tensors[rng() % specs.size()];
    const size_t n = Elements(t);
    if (n == 0) continue;
    const Role role = specs[&t - state.tensors.data()].role;
    for (size_t c = std::max<size_t>(1, n / 1000); c > 0; --c) UpdateElements(t, role, rng() % n, 1, rng);
  }
}

// ---------------------------------------------------------------------------
// Cases.

const char* SaveModeName(SaveMode mode) {
  switch (mode) {
    case SaveMode::kFull: return "full";
    case SaveMode::kExact: return "exact";
    case SaveMode::kTopK: return "topk";
    case SaveMode::kZstd: return "zstd";
    case SaveMode::kZstdExact: return "zstd+exact";
    case SaveMode::kZstdTopK: return "zstd+topk";
  }
  return "?";
}

const char* PoolSizeName(PoolSize pool) {
  switch (pool) {
    case PoolSize::kGrow: return "grow";
    case PoolSize::kLessThanState: return "lt_state";
    case PoolSize::kLessThanTensor: return "lt_tensor";
    case PoolSize::kOneChunk: return "one_chunk";
    case PoolSize::kBytes: return "bytes";
  }
  return "?";
}

size_t StagingBytes(PoolSize pool, size_t staging_bytes, size_t chunk, uint64_t state_bytes,
                    uint64_t largest) {
  auto half = [&](uint64_t n) { return std::max<size_t>(chunk, n / 2 / chunk * chunk); };
  switch (pool) {
    case PoolSize::kGrow: return 0;
    case PoolSize::kLessThanState: return half(state_bytes);
    case PoolSize::kLessThanTensor: return half(largest);
    case PoolSize::kOneChunk: return chunk;
    case PoolSize::kBytes: return staging_bytes;
  }
  return 0;
}

size_t PoolBytes(size_t staging_bytes, size_t chunk_bytes) {  // as Engine::Start rounds it
  if (staging_bytes == 0) return 0;
  return std::max<size_t>(2, (staging_bytes + chunk_bytes - 1) / chunk_bytes) * chunk_bytes;
}

size_t StagingBytes(const CaseSpec& spec) {
  return StagingBytes(spec.pool, spec.staging_bytes, spec.chunk_bytes, spec.layout.bytes(),
                      spec.layout.largest());
}

size_t PoolBytes(const CaseSpec& spec) { return PoolBytes(StagingBytes(spec), spec.chunk_bytes); }

bool EncodesShards(const CaseSpec& spec) { return spec.mode != SaveMode::kFull; }

bool WritesDeltas(const CaseSpec& spec) {
  return spec.mode == SaveMode::kExact || spec.mode == SaveMode::kTopK ||
         spec.mode == SaveMode::kZstdExact || spec.mode == SaveMode::kZstdTopK;
}

EngineOptions OptionsFor(const CaseSpec& spec) {
  EngineOptions options;
  options.io.chunk_bytes = spec.chunk_bytes;
  options.shard_min_bytes = spec.shard_min_bytes;
  options.shard_max_bytes = spec.shard_max_bytes;
  options.staging_bytes = StagingBytes(spec);
  options.when_busy = spec.when_busy;
  options.lazy_staging = spec.lazy;
  const bool zstd = spec.mode == SaveMode::kZstd || spec.mode == SaveMode::kZstdExact ||
                    spec.mode == SaveMode::kZstdTopK;
  options.compression_level = zstd ? spec.zstd_level : 0;
  const bool topk = spec.mode == SaveMode::kTopK || spec.mode == SaveMode::kZstdTopK;
  options.delta.mode = !WritesDeltas(spec) ? DeltaOptions::Mode::kNone
                       : topk              ? DeltaOptions::Mode::kTopK
                                           : DeltaOptions::Mode::kExact;
  options.delta.topk_ratio = spec.topk_ratio;
  options.delta.full_every = spec.full_every;
  return options;
}

std::string Describe(const CaseSpec& spec) {
  std::vector<std::string> mutations;
  for (Mutation m : spec.mutations) mutations.push_back(MutationName(m));
  const size_t pool = PoolBytes(spec);
  return absl::StrCat(
      spec.label, " | state=", spec.layout.description, " tensors=", spec.layout.tensors.size(),
      " bytes=", spec.layout.bytes(), " largest=", spec.layout.largest(), " seed=", spec.seed,
      " | mode=", SaveModeName(spec.mode),
      spec.mode >= SaveMode::kZstd ? absl::StrCat(" zstd_level=", spec.zstd_level) : "",
      WritesDeltas(spec) ? absl::StrCat(" topk_ratio=", spec.topk_ratio, " full_every=", spec.full_every) : "",
      spec.lazy ? " staging=lazy" : " staging=eager", " pool=", PoolSizeName(spec.pool),
      pool == 0 ? "" : absl::StrCat("(staging_bytes=", StagingBytes(spec), "->", pool / spec.chunk_bytes, " chunks)"),
      " chunk=", Kib(spec.chunk_bytes), " shards=[", Kib(spec.shard_min_bytes), ",",
      Kib(spec.shard_max_bytes), "]->", spec.layout.Shards(spec.shard_min_bytes, spec.shard_max_bytes),
      " files", spec.when_busy == EngineOptions::BusyPolicy::kSkip ? " busy=skip" : " busy=wait",
      spec.pipelined ? " pipelined" : " wait_each", " mutations=[", absl::StrJoin(mutations, ","), "]");
}

void PrintTo(const CaseSpec& spec, std::ostream* os) { *os << spec.label; }

CaseSpec RandomCase(uint64_t seed) {
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + 1);
  CaseSpec spec;
  spec.label = absl::StrCat("random seed ", seed);
  spec.seed = seed;
  spec.layout = RandomLayout(rng);
  spec.mode = static_cast<SaveMode>(rng() % 6);
  spec.zstd_level = 1 + static_cast<int>(rng() % 3);
  spec.topk_ratio = Pick(rng, {0.01, 0.05, 0.25, 1.0});
  spec.full_every = 1 + static_cast<int>(rng() % 4);
  spec.lazy = rng() % 2 == 0;
  spec.pool = static_cast<PoolSize>(rng() % 5);
  spec.chunk_bytes = rng() % 10 == 0 ? size_t{16} << 20
                                     : Pick<size_t>(rng, {64 << 10, 128 << 10, 1 << 20});
  spec.staging_bytes = (1 + rng() % 64) * spec.chunk_bytes / (1 + rng() % 2);
  const auto caps = Pick<std::pair<uint64_t, uint64_t>>(
      rng, {{0, 64 << 10}, {0, 1 << 20}, {64 << 10, 256 << 10}, {1 << 20, 16 << 20},
            {16 << 20, 256 << 20}, {kHugeShard, kHugeShard}});
  spec.shard_min_bytes = caps.first;
  spec.shard_max_bytes = caps.second;
  spec.when_busy = rng() % 3 == 0 ? EngineOptions::BusyPolicy::kSkip : EngineOptions::BusyPolicy::kWait;
  spec.pipelined = spec.when_busy == EngineOptions::BusyPolicy::kSkip || rng() % 2 == 0;
  for (int i = 1 + static_cast<int>(rng() % 5); i > 0; --i) {
    spec.mutations.push_back(static_cast<Mutation>(rng() % 3));
  }
  // A growing pool holds one chunk per shard at least: keep it under 512 MiB.
  for (size_t smaller : {size_t{1} << 20, size_t{64} << 10}) {
    if (spec.layout.Chunks(spec.shard_min_bytes, spec.shard_max_bytes, spec.chunk_bytes) *
            spec.chunk_bytes <= (size_t{512} << 20)) {
      break;
    }
    spec.chunk_bytes = std::min(spec.chunk_bytes, smaller);
  }
  return spec;
}

// ---------------------------------------------------------------------------
// Running a case.

namespace {

struct Saved {
  int64_t step = 0;
  std::string extras;
  std::vector<OwnedTensor> snapshot;  // the state as it was saved
  std::shared_ptr<SaveHandle> handle;
};

// Whether every save must be "full" or "delta" as `full_every` says: deltas
// are on, each save is committed before the next starts, the pool can grow
// to hold a delta's records, and some tensor's delta is surely smaller than
// it (few changes, or top-k keeping at most a quarter of a float tensor).
bool KindsAreCertain(const CaseSpec& spec) {
  if (!WritesDeltas(spec) || spec.pipelined || spec.pool != PoolSize::kGrow) return false;
  const TensorSpec* largest = nullptr;
  for (const TensorSpec& t : spec.layout.tensors) {
    if (largest == nullptr || t.bytes() > largest->bytes()) largest = &t;
  }
  if (largest == nullptr || largest->bytes() < 4096) return false;
  const bool topk = spec.mode == SaveMode::kTopK || spec.mode == SaveMode::kZstdTopK;
  for (Mutation m : spec.mutations) {
    if (m == Mutation::kDense && !(topk && spec.topk_ratio <= 0.25 && IsFloatingDType(largest->dtype))) {
      return false;
    }
  }
  return true;
}

// Reads step `saved.step` back and expects `saved.snapshot`: every tensor
// bit-exact, or (a top-k delta) within its error bound, and that bound
// reached (it is the largest dropped change, and dropped elements restore to
// the reference); extras; `Verify()`.
void ExpectRestores(const std::string& root, const Saved& saved, bool lossy, size_t chunk_bytes) {
  ReaderOptions options;
  options.step = saved.step;
  options.io.chunk_bytes = chunk_bytes;
  options.io.buffer_bytes = 4 * chunk_bytes;
  auto reader = Reader::Open(root, options);
  ASSERT_TRUE(reader.ok()) << "opening step " << saved.step << ": " << reader.status();
  EXPECT_EQ((*reader)->extras_json(), saved.extras);
  auto all = (*reader)->ReadAll();
  ASSERT_TRUE(all.ok()) << "reading step " << saved.step << ": " << all.status();
  ASSERT_EQ(all->size(), saved.snapshot.size()) << "step " << saved.step;
  int failures = 0;
  for (size_t i = 0; i < all->size() && failures < 10; ++i) {
    const Tensor& got = (*all)[i];
    const OwnedTensor& want = saved.snapshot[i];
    const std::string where = absl::StrCat(want.name, " at step ", saved.step);
    const TensorInfo* info = (*reader)->Find(want.name);
    if (got.name != want.name || got.dtype != want.dtype || got.shape != want.shape ||
        got.nbytes() != want.bytes.size() || info == nullptr) {
      ADD_FAILURE() << where << ": restored as " << got.name << " " << DTypeName(got.dtype)
                    << " of " << got.nbytes() << " bytes";
      ++failures;
      continue;
    }
    if (info->error_bound == 0) {
      if (want.bytes.empty() || std::memcmp(got.data(), want.bytes.data(), want.bytes.size()) == 0) continue;
      const auto* g = static_cast<const uint8_t*>(got.data());
      size_t at = 0;
      while (g[at] == want.bytes[at]) ++at;
      ADD_FAILURE() << where << " (" << info->encoding << ") differs first at byte " << at
                    << " of " << want.bytes.size();
      ++failures;
      continue;
    }
    if (!lossy || !IsFloatingDType(want.dtype) || info->encoding != RecordEncoding::kTopK) {
      ADD_FAILURE() << where << ": error bound " << info->error_bound << " with encoding "
                    << info->encoding << " in a case without lossy deltas";
      ++failures;
      continue;
    }
    const size_t size = DTypeSize(want.dtype);
    const auto* g = static_cast<const uint8_t*>(got.data());
    double error = 0;
    for (size_t e = 0; e < want.bytes.size(); e += size) {
      if (std::memcmp(g + e, &want.bytes[e], size) == 0) continue;
      const double a = Load(&want.bytes[e], want.dtype);
      const double b = Load(g + e, want.dtype);
      error = std::max(error, std::isfinite(a) && std::isfinite(b)
                                  ? std::fabs(a - b)
                                  : std::numeric_limits<double>::infinity());
    }
    EXPECT_LE(error, info->error_bound) << where;
    EXPECT_EQ(error, info->error_bound) << where << ": the bound is not the largest dropped change";
    failures += error > info->error_bound;
  }
  const absl::Status verified = (*reader)->Verify();
  EXPECT_TRUE(verified.ok()) << "Verify step " << saved.step << ": " << verified;
}

// Closes the engine when the case ends, even by a failed assertion, under a
// deadline (the engine's destructor waits for saves in flight).
struct EngineCloser {
  std::unique_ptr<Engine> engine;
  std::string what;
  ~EngineCloser() {
    if (engine == nullptr) return;
    Deadline deadline(what);
    engine.reset();
  }
};

}  // namespace

void RunCase(const CaseSpec& spec) {
  const std::string described = Describe(spec);
  SCOPED_TRACE(described);
  auto what = [&](absl::string_view call, int64_t step) {
    return absl::StrCat(call, step >= 0 ? absl::StrCat(" of step ", step) : "", " in case ", described);
  };
  RealisticState state = MakeState(spec.layout, spec.seed);
  ScratchDir dir("ckpt-realistic");
  const std::string root = dir.Join("root");
  EngineCloser closer{nullptr, what("closing the engine (destructor)", -1)};
  {
    auto engine = Engine::Open(root, OptionsFor(spec));
    ASSERT_TRUE(engine.ok()) << engine.status();
    closer.engine = std::move(*engine);
  }
  Engine& engine = *closer.engine;

  std::mt19937_64 rng(spec.seed * 0xD1B54A32D192ED03ull + 7);
  std::vector<Saved> saves;
  for (size_t i = 0; i <= spec.mutations.size(); ++i) {
    if (i > 0) Mutate(state, spec.mutations[i - 1], rng);
    Saved s;
    s.step = 100 * static_cast<int64_t>(i + 1);
    s.extras = absl::StrCat(R"({"epoch":)", i, R"(,"step":)", s.step, "}");
    s.snapshot = state.tensors;
    const std::vector<TensorView> views = state.views();
    {
      Deadline deadline(what("SaveAsync", s.step));
      auto handle = engine.SaveAsync(s.step, views, s.extras);
      ASSERT_TRUE(handle.ok()) << "SaveAsync of step " << s.step << ": " << handle.status();
      s.handle = std::move(*handle);
    }
    {
      Deadline deadline(what("WaitStaged", s.step));
      const absl::Status staged = s.handle->WaitStaged();  // before the state changes
      ASSERT_TRUE(staged.ok()) << "WaitStaged of step " << s.step << ": " << staged;
    }
    if (!spec.pipelined) {
      const absl::Status done = WaitWithDeadline(*s.handle, CaseDeadline(), what("Wait", s.step));
      ASSERT_TRUE(done.ok()) << "save of step " << s.step << ": " << done;
    }
    if (s.handle->skipped()) {
      // Training goes on meanwhile: let the saves in flight finish, so that
      // the next one is not skipped too and the case commits a chain.
      for (const Saved& earlier : saves) {
        (void)WaitWithDeadline(*earlier.handle, CaseDeadline(), what("Wait", earlier.step));
      }
    }
    saves.push_back(std::move(s));
  }

  std::vector<const Saved*> committed;
  std::vector<std::optional<CheckpointKind>> kinds;
  size_t skipped = 0;
  for (const Saved& s : saves) {
    const absl::Status done = WaitWithDeadline(*s.handle, CaseDeadline(), what("Wait", s.step));
    EXPECT_TRUE(done.ok()) << "save of step " << s.step << ": " << done;
    if (s.handle->skipped()) {
      ++skipped;
      EXPECT_EQ(spec.when_busy, EngineOptions::BusyPolicy::kSkip) << "step " << s.step;
      EXPECT_NE(&s, &saves.front()) << "the first save was skipped";
      continue;
    }
    if (!done.ok()) continue;
    committed.push_back(&s);
    kinds.push_back(s.handle->stats().kind);
    EXPECT_EQ(s.handle->stats().tensor_count, s.snapshot.size()) << "step " << s.step;
  }
  const EngineStats stats = engine.stats();
  EXPECT_EQ(stats.saves_committed, committed.size());
  EXPECT_EQ(stats.saves_skipped, skipped);
  EXPECT_EQ(stats.saves_failed, 0u);
  {
    Deadline deadline(what("Close", -1));
    const absl::Status closed = engine.Close();
    EXPECT_TRUE(closed.ok()) << closed;
  }
  const std::string outcome = absl::StrCat("committed ", absl::StrJoin(kinds, ",", [](std::string* out, const std::optional<CheckpointKind>& kind) {
    out->append(KindName(kind));
  }), "; skipped ",
                                           skipped, " of ", saves.size());
  SCOPED_TRACE(outcome);
  const char* verbose = std::getenv("CKPT_CASE_VERBOSE");
  if (verbose != nullptr && std::string(verbose) == "1") {
    std::printf("%s\n  %s\n", described.c_str(), outcome.c_str());
  }

  // What is on disk: exactly the committed steps, full or delta as expected.
  if (!kinds.empty()) {
    EXPECT_EQ(kinds.front(), CheckpointKind::kFull);
  }
  for (size_t i = 0; i < kinds.size(); ++i) {
    if (!WritesDeltas(spec)) {
      EXPECT_EQ(kinds[i], CheckpointKind::kFull) << "save #" << i;
    }
    if (KindsAreCertain(spec)) {
      EXPECT_EQ(kinds[i], i % spec.full_every == 0 ? CheckpointKind::kFull : CheckpointKind::kDelta) << "save #" << i;
    }
  }
  auto listed = ListCheckpoints(root);
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), committed.size());
  for (size_t i = 0; i < committed.size(); ++i) {
    const CheckpointSummary& c = (*listed)[i];
    EXPECT_EQ(c.step, committed[i]->step);
    EXPECT_TRUE(c.manifest_status.ok()) << c.manifest_status;
    EXPECT_EQ(c.kind, kinds[i]) << "step " << c.step;
    if (c.kind != CheckpointKind::kDelta) continue;
    // Differential deltas (the default) apply to the last full save.
    int64_t base = -1;
    for (size_t j = i; j > 0; --j) {
      if (kinds[j - 1] == CheckpointKind::kFull || OptionsFor(spec).delta.base == DeltaOptions::Base::kChained) {
        base = committed[j - 1]->step;
        break;
      }
    }
    EXPECT_EQ(c.base_step, base) << "step " << c.step;
    const bool topk = spec.mode == SaveMode::kTopK || spec.mode == SaveMode::kZstdTopK;
    EXPECT_EQ(c.delta_mode, topk ? DeltaOptions::Mode::kTopK : DeltaOptions::Mode::kExact) << "step " << c.step;
    if (!topk) {
      EXPECT_EQ(c.max_error_bound, 0.0) << "step " << c.step;
    }
  }

  // Every committed step restores what was saved.
  const bool lossy = spec.mode == SaveMode::kTopK || spec.mode == SaveMode::kZstdTopK;
  for (const Saved* s : committed) {
    Deadline deadline(what("reading back", s->step));
    ExpectRestores(root, *s, lossy, spec.chunk_bytes);
  }
}

}  // namespace ckpt::testing
