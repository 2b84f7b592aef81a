// Checkpoint states shaped like real models (GPT with AdamW, ResNet with
// SGD, ten thousand tiny tensors, one tensor larger than the staging pool),
// the changes training makes between saves, and `RunCase`: several saves of
// one such state under one set of engine options, every committed step read
// back and compared with what was saved. Every blocking call runs under a
// `Deadline`, so a hung save fails the binary in about a minute, naming the
// case and the call, instead of hanging CI.
#ifndef CKPT_TESTS_REALISTIC_STATES_H_
#define CKPT_TESTS_REALISTIC_STATES_H_

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <ostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "ckpt/engine.h"
#include "ckpt/options.h"
#include "test_util.h"

namespace ckpt::testing {

// ---------------------------------------------------------------------------
// Deadlines.

// `CaseDeadline` is how long one blocking call of a case may take:
// $CKPT_CASE_DEADLINE_S seconds, 60 when unset.
absl::Duration CaseDeadline();

// `Deadline` aborts the process unless it is destroyed within `limit` of its
// construction: it reports a GoogleTest failure and a "[  HUNG    ]" line
// naming `what` and the time it waited, then calls `std::abort()`.
class Deadline {
 public:
  Deadline(std::string what, absl::Duration limit = CaseDeadline());
  ~Deadline();
  Deadline(const Deadline&) = delete;
  Deadline& operator=(const Deadline&) = delete;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

// `WaitWithDeadline` is `handle.Wait()`, aborting the process (see `Deadline`)
// if it has not returned within `limit`.
absl::Status WaitWithDeadline(SaveHandle& handle, absl::Duration limit = CaseDeadline(),
                              const std::string& what = "SaveHandle::Wait");

// ---------------------------------------------------------------------------
// State layouts: names, dtypes and shapes as in real `state_dict`s.

// What a tensor is, which decides its initial values and how training
// changes it.
enum class Role : uint8_t {
  kWeight,       // trained parameter, initialised N(0, 0.02)
  kNormWeight,   // LayerNorm/BatchNorm scale, initialised near 1
  kExpAvg,       // AdamW first moment
  kExpAvgSq,     // AdamW second moment (non-negative)
  kMomentum,     // SGD momentum buffer
  kStep,         // optimizer step count (0-d): += 1 per update
  kRunningMean,  // BatchNorm running statistics
  kRunningVar,
  kCounter,      // BatchNorm num_batches_tracked (int64, 0-d)
  kBuffer,       // constant (attention masks)
  kMisc,         // anything else: random values, perturbed
};

struct TensorSpec {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  Role role = Role::kMisc;
  uint64_t bytes() const;
};

struct StateLayout {
  std::string description;  // e.g. "gpt(vocab=5000,d=64,layers=2,fp32)"
  std::vector<TensorSpec> tensors;
  // The embedding and the tensors indexed by its rows (its optimizer state)
  // plus its step: what a sparse update changes. Empty: no embedding.
  std::vector<size_t> embedding_group;
  uint64_t bytes() const;    // sum of the tensors' sizes
  uint64_t largest() const;  // the largest tensor
  // Shard files a save of this layout is planned into (the engine's planner).
  size_t Shards(uint64_t shard_min_bytes, uint64_t shard_max_bytes) const;
  // Staging chunks a save needs (each shard starts a chunk).
  size_t Chunks(uint64_t shard_min_bytes, uint64_t shard_max_bytes, size_t chunk_bytes) const;
};

// GPT-2 style: token and position embeddings, `layers` blocks (ln_1, attn
// c_attn/c_proj, bool causal-mask buffer, ln_2, mlp c_fc/c_proj), ln_f, an
// untied lm_head of the embedding's size, and AdamW state per parameter
// (`optim.state.<i>.exp_avg`, `.exp_avg_sq`, 0-d fp32 `.step`). `mixed`:
// bf16 embeddings and block weights, fp16 lm_head, fp32 LayerNorms and
// optimizer state, plus a GradScaler's 0-d `scale` (fp32) and
// `growth_tracker` (int32).
struct GptConfig {
  int64_t vocab = 5000;
  int64_t d_model = 64;
  int64_t layers = 2;
  int64_t context = 64;
  bool mixed = false;
  bool optimizer = true;
};
StateLayout GptLayout(const GptConfig& config);

// ResNet style: stem conv (4-d) and BatchNorm (weight, bias, running_mean,
// running_var, int64 0-d num_batches_tracked), `stages` stages of one basic
// block (two 3x3 convs, a 1x1 downsample from the second stage), fc, and an
// SGD momentum buffer per parameter. `conv_dtype` is the convs' and fc's dtype.
struct ResNetConfig {
  int64_t width = 32;
  int64_t stages = 3;
  int64_t classes = 100;
  DType conv_dtype = DType::kFloat32;
  bool momentum = true;
};
StateLayout ResNetLayout(const ResNetConfig& config);

// `count` tiny tensors (0 to a few hundred bytes, every dtype, 0-d and
// 0-byte ones) in `nn.ParameterList`-style modules of 50
// ("model.layers.<l>.<list>.<k>").
StateLayout TinyTensorsLayout(size_t count);

// One tensor of about `large_bytes` (bf16 embedding), a second of
// `large_bytes / 3`, and a few small ones.
StateLayout LargeTensorLayout(uint64_t large_bytes);

// `modules` modules of one 24 KiB fp32 tensor each: with shard_min_bytes = 0
// and shard_max_bytes >= 24 KiB, exactly `modules` shard files.
StateLayout ModulesLayout(size_t modules);

// A random layout: any of the above with random sizes, or a soup of random
// dtypes, ranks (0..4) and dimensions (0 included), possibly no tensor.
StateLayout RandomLayout(std::mt19937_64& rng);

// ---------------------------------------------------------------------------
// States and their changes.

struct RealisticState {
  StateLayout layout;
  std::vector<OwnedTensor> tensors;  // in layout order
  std::vector<TensorView> views() const { return Views(tensors); }
};
// Deterministic from `seed`: values as each tensor's role suggests.
RealisticState MakeState(StateLayout layout, uint64_t seed);

enum class Mutation : uint8_t {
  kNone,    // nothing changes
  kSparse,  // a few rows of the embedding (and its optimizer rows and step);
            // without an embedding, a few elements of up to three tensors
  kDense,   // an AdamW/SGD step: every parameter, moment, statistic, count
};
const char* MutationName(Mutation m);
void Mutate(RealisticState& state, Mutation mutation, std::mt19937_64& rng);

// ---------------------------------------------------------------------------
// Cases.

enum class SaveMode : uint8_t { kFull, kExact, kTopK, kZstd, kZstdExact, kZstdTopK };
const char* SaveModeName(SaveMode mode);

enum class PoolSize : uint8_t {
  kGrow,            // staging_bytes = 0: the pool grows to the largest save
  kLessThanState,   // about half the state (the pool is smaller than the state)
  kLessThanTensor,  // about half the largest tensor (the pool is smaller than it)
  kOneChunk,        // staging_bytes = chunk_bytes: the pool's minimum, 2 chunks
  kBytes,           // `CaseSpec::staging_bytes`
};
const char* PoolSizeName(PoolSize pool);

struct CaseSpec {
  std::string label;  // the matrix row, or "random seed N"
  StateLayout layout;
  uint64_t seed = 1;  // of the state's values and its changes
  SaveMode mode = SaveMode::kFull;
  int zstd_level = 1;
  double topk_ratio = 0.05;
  int full_every = 3;
  bool lazy = false;
  PoolSize pool = PoolSize::kGrow;
  size_t staging_bytes = 0;  // for kBytes
  size_t chunk_bytes = size_t{1} << 20;
  uint64_t shard_min_bytes = 0;
  uint64_t shard_max_bytes = uint64_t{64} << 10;
  EngineOptions::BusyPolicy when_busy = EngineOptions::BusyPolicy::kWait;
  // Start every save without waiting for the previous one to commit (only
  // for it to be staged); otherwise wait for each save's commit.
  bool pipelined = false;
  // The change before each save after the first: saves = size() + 1.
  std::vector<Mutation> mutations;
};

inline constexpr uint64_t kHugeShard = uint64_t{1} << 40;  // everything in one shard

// `staging_bytes` as the engine is given it, and the pool it makes (0: grows),
// for a state of `state_bytes` whose largest tensor has `largest` bytes.
size_t StagingBytes(PoolSize pool, size_t staging_bytes, size_t chunk_bytes, uint64_t state_bytes,
                    uint64_t largest);
size_t PoolBytes(size_t staging_bytes, size_t chunk_bytes);
size_t StagingBytes(const CaseSpec& spec);
size_t PoolBytes(const CaseSpec& spec);
EngineOptions OptionsFor(const CaseSpec& spec);
// Whether the engine writes encoded (zstd or delta) shards in this case, and
// deltas in particular.
bool EncodesShards(const CaseSpec& spec);
bool WritesDeltas(const CaseSpec& spec);
// Everything needed to reproduce the case, on one line.
std::string Describe(const CaseSpec& spec);
// GoogleTest prints a case parameter as its label.
void PrintTo(const CaseSpec& spec, std::ostream* os);

// A random case: layout, options, mutations, all from `seed`.
CaseSpec RandomCase(uint64_t seed);

// Runs `spec`: opens an engine on a fresh root, saves `mutations.size() + 1`
// times (mutating between saves once the previous save is staged), waits,
// closes, then reads every committed step back: bit-exact for lossless
// modes, within (and exactly at) the recorded error bound for top-k deltas;
// `Verify()` on every step. Reports failures through GoogleTest. With
// CKPT_CASE_VERBOSE=1 it prints the case and what it committed.
void RunCase(const CaseSpec& spec);

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_REALISTIC_STATES_H_
