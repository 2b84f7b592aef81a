// Every save mode on states shaped like real models: each case saves one
// state five times (full_every = 3: full, delta, delta, full, delta when
// deltas are on) with training-like changes between saves, closes the
// engine, and reads every committed step back — bit-exact, or for top-k
// deltas within (and at) the recorded error bound — then `Verify()`s it.
//
// Design. The options form eight factors:
//
//   state      gpt (fp32 GPT-2 + AdamW, 9 MB), gpt_mixed (bf16/fp16 weights,
//              fp32 AdamW, GradScaler), resnet (4-d convs, BatchNorm with
//              int64 counters, SGD momentum), tiny10k (10,000 tensors of
//              0..200 bytes, every dtype, 0-d and 0-byte ones), large (a
//              3 MiB tensor, bigger than the small pools)
//   mode       full, exact delta, top-k delta (ratio 0.05), zstd (levels 1, 2
//              and 3 in turn), zstd + exact delta
//   staging    eager, lazy (WaitStaged before the state changes)
//   pool       grow (staging_bytes = 0), < state, < largest tensor, one chunk
//              (staging_bytes = chunk_bytes: the 2-chunk minimum)
//   chunk      64 KiB, 1 MiB, 16 MiB
//   shards     tiny (shard_min_bytes = 0, shard_max_bytes = 64 KiB: one file
//              per module, dozens to hundreds of files), huge (one file)
//   flow       wait_each (each save commits before the state changes),
//              pipelined (saves overlap; when_busy = kWait), skip (saves
//              overlap; when_busy = kSkip: skipped saves must not be on disk)
//   mutation   dense (an AdamW/SGD step on every element), sparse (a few
//              embedding rows and their optimizer rows), none
//
// The full product is 10,800 cases; `PairwiseRows` picks a covering set
// (about 30 rows, built greedily and deterministically at start-up) that
// holds every pair of values of any two factors that can occur together
// (`PairwiseDesignTest` checks it). Pairs that cannot occur: a pool smaller
// than the state or than a tensor with 16 MiB chunks (the pool is at least 2
// chunks, 32 MiB, more than these states), or smaller than a tensor for the
// tiny10k state and, with 1 MiB chunks, for states whose largest tensor is
// under 2 MiB; a growing pool of over 512 MiB (16 MiB chunks x one chunk per
// shard file, at least, x dozens of tiny shards) is avoided too.
//
// `RiskyCases` adds the combinations most likely to break: many shards with
// delta or zstd encoding, small pools, small chunks, exactly 8 and 9 shard
// files (the encoder has 8 output buffers), a pool exactly at the size a
// delta needs. `RandomCases` runs 8 random cases (layouts, dtypes, options,
// mutations); realistic_state_slow_test.cc runs many more.
//
// Every blocking call has a deadline ($CKPT_CASE_DEADLINE_S, 60 s): a hung
// save aborts the binary naming the case and the call. The case's options
// are printed with any failure (SCOPED_TRACE), and `label` names the row.
#include <array>
#include <map>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "realistic_states.h"

namespace ckpt::testing {
namespace {

constexpr int kFactors = 8;
using Row = std::array<int, kFactors>;
constexpr std::array<int, kFactors> kLevels = {5, 5, 2, 4, 3, 2, 3, 3};
constexpr const char* kFactorNames[kFactors] = {"state", "mode",   "staging", "pool",
                                                "chunk", "shards", "flow",    "mutation"};
constexpr const char* kStates[] = {"gpt", "gpt_mixed", "resnet", "tiny10k", "large"};
constexpr SaveMode kModes[] = {SaveMode::kFull, SaveMode::kExact, SaveMode::kTopK, SaveMode::kZstd,
                               SaveMode::kZstdExact};
constexpr PoolSize kPools[] = {PoolSize::kGrow, PoolSize::kLessThanState,
                               PoolSize::kLessThanTensor, PoolSize::kOneChunk};
constexpr size_t kChunks[] = {size_t{64} << 10, size_t{1} << 20, size_t{16} << 20};
constexpr const char* kFlows[] = {"wait_each", "pipelined", "skip"};
constexpr Mutation kMutations[] = {Mutation::kDense, Mutation::kSparse, Mutation::kNone};

const StateLayout& LayoutOf(int state) {
  static const auto* layouts = new std::vector<StateLayout>{
      GptLayout(GptConfig{}),
      GptLayout(GptConfig{.mixed = true}),
      ResNetLayout(ResNetConfig{}),
      TinyTensorsLayout(10000),
      LargeTensorLayout(3 << 20),
  };
  return (*layouts)[state];
}

// The row's case, but for its layout (see `LayoutOf`).
CaseSpec SpecOf(const Row& row) {
  CaseSpec spec;
  spec.mode = kModes[row[1]];
  spec.lazy = row[2] == 1;
  spec.pool = kPools[row[3]];
  spec.chunk_bytes = kChunks[row[4]];
  spec.shard_min_bytes = row[5] == 0 ? 0 : kHugeShard;
  spec.shard_max_bytes = row[5] == 0 ? uint64_t{64} << 10 : kHugeShard;
  spec.pipelined = row[6] != 0;
  spec.when_busy = row[6] == 2 ? EngineOptions::BusyPolicy::kSkip : EngineOptions::BusyPolicy::kWait;
  spec.mutations.assign(4, kMutations[row[7]]);
  spec.topk_ratio = 0.05;
  spec.full_every = 3;
  return spec;
}

std::string RowName(const Row& row) {
  static constexpr const char* kChunkNames[] = {"64K", "1M", "16M"};
  const CaseSpec spec = SpecOf(row);
  std::string mode = SaveModeName(spec.mode);
  for (char& c : mode) c = c == '+' ? '_' : c;
  return absl::StrCat(kStates[row[0]], "_", mode, "_", row[2] == 1 ? "lazy" : "eager", "_",
                      PoolSizeName(spec.pool), "_", kChunkNames[row[4]], "_",
                      row[5] == 0 ? "tinyshards" : "oneshard", "_", kFlows[row[6]], "_",
                      MutationName(kMutations[row[7]]));
}

// Whether the row's options can hold together (see the top comment).
bool Feasible(const Row& row) {
  struct Sizes {
    uint64_t bytes, largest;
    size_t chunks[3][2];  // per chunk size and shard cap: chunks a save needs
  };
  static const auto* sizes = [] {
    auto* out = new std::vector<Sizes>;
    for (int state = 0; state < kLevels[0]; ++state) {
      const StateLayout& layout = LayoutOf(state);
      Sizes s{layout.bytes(), layout.largest(), {}};
      for (int c = 0; c < 3; ++c) {
        s.chunks[c][0] = layout.Chunks(0, uint64_t{64} << 10, kChunks[c]);
        s.chunks[c][1] = layout.Chunks(kHugeShard, kHugeShard, kChunks[c]);
      }
      out->push_back(s);
    }
    return out;
  }();
  const Sizes& s = (*sizes)[row[0]];
  const PoolSize pool = kPools[row[3]];
  const size_t chunk = kChunks[row[4]];
  const size_t bytes = PoolBytes(StagingBytes(pool, 0, chunk, s.bytes, s.largest), chunk);
  if (pool == PoolSize::kLessThanState && bytes >= s.bytes) return false;
  if (pool == PoolSize::kLessThanTensor && bytes >= s.largest) return false;
  // A growing pool holds one chunk per shard at least (2 more for deltas).
  if (pool == PoolSize::kGrow && (s.chunks[row[4]][row[5]] + 2) * chunk > (size_t{512} << 20)) {
    return false;
  }
  return true;
}

using Pair = std::tuple<int, int, int, int>;  // factor, value, later factor, value

void AddPairs(const Row& row, std::set<Pair>& out) {
  for (int a = 0; a < kFactors; ++a) {
    for (int b = a + 1; b < kFactors; ++b) out.insert({a, row[a], b, row[b]});
  }
}

// Every row of the full product, in order.
std::vector<Row> AllRows() {
  std::vector<Row> all;
  Row row{};
  while (true) {
    all.push_back(row);
    int f = kFactors - 1;
    while (f >= 0 && ++row[f] == kLevels[f]) row[f--] = 0;
    if (f < 0) return all;
  }
}

// Pair (a, row[a], b, row[b]) as one index below kPairSlots.
constexpr int kPairSlots = kFactors * kFactors * 5 * 5;
int PairIndex(int a, int va, int b, int vb) { return ((a * kFactors + b) * 5 + va) * 5 + vb; }

// Greedy covering: among every feasible row (in a fixed pseudo-random order),
// repeatedly take the one that covers the most pairs not yet covered.
std::vector<Row> PairwiseRows() {
  std::vector<Row> all;
  for (const Row& r : AllRows()) {
    if (Feasible(r)) all.push_back(r);
  }
  std::mt19937_64 rng(20241201);
  for (size_t i = all.size() - 1; i > 0; --i) std::swap(all[i], all[rng() % (i + 1)]);
  std::vector<std::vector<int>> pairs(all.size());
  std::vector<bool> uncovered(kPairSlots, false);
  size_t left = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    for (int a = 0; a < kFactors; ++a) {
      for (int b = a + 1; b < kFactors; ++b) {
        const int p = PairIndex(a, all[i][a], b, all[i][b]);
        pairs[i].push_back(p);
        if (!uncovered[p]) ++left;
        uncovered[p] = true;
      }
    }
  }
  std::vector<Row> chosen;
  while (left > 0) {
    size_t best = 0, best_gain = 0;
    for (size_t i = 0; i < all.size(); ++i) {
      size_t gain = 0;
      for (int p : pairs[i]) gain += uncovered[p];
      if (gain > best_gain) best = i, best_gain = gain;
    }
    for (int p : pairs[best]) {
      if (uncovered[p]) --left;
      uncovered[p] = false;
    }
    chosen.push_back(all[best]);
  }
  return chosen;
}

const std::vector<Row>& Rows() {
  static const auto* rows = new std::vector<Row>(PairwiseRows());
  return *rows;
}

std::vector<CaseSpec> PairwiseCases() {
  std::vector<CaseSpec> cases;
  int zstd = 0;
  for (size_t i = 0; i < Rows().size(); ++i) {
    CaseSpec spec = SpecOf(Rows()[i]);
    spec.layout = LayoutOf(Rows()[i][0]);
    spec.label = absl::StrCat("p", i < 10 ? "0" : "", i, "_", RowName(Rows()[i]));
    spec.seed = 1000 + i;
    if (spec.mode == SaveMode::kZstd || spec.mode == SaveMode::kZstdExact) {
      spec.zstd_level = 1 + zstd++ % 3;
    }
    cases.push_back(std::move(spec));
  }
  return cases;
}

std::vector<CaseSpec> RiskyCases() {
  std::vector<CaseSpec> cases;
  auto add = [&](std::string label, StateLayout layout, SaveMode mode, PoolSize pool,
                 size_t chunk, bool tiny_shards, bool lazy, int flow, Mutation mutation) {
    CaseSpec spec;
    spec.label = std::move(label);
    spec.layout = std::move(layout);
    spec.seed = 7000 + cases.size();
    spec.mode = mode;
    spec.zstd_level = 1 + static_cast<int>(cases.size() % 3);
    spec.pool = pool;
    spec.chunk_bytes = chunk;
    spec.shard_min_bytes = tiny_shards ? 0 : kHugeShard;
    spec.shard_max_bytes = tiny_shards ? uint64_t{64} << 10 : kHugeShard;
    spec.lazy = lazy;
    spec.pipelined = flow != 0;
    spec.when_busy = flow == 2 ? EngineOptions::BusyPolicy::kSkip : EngineOptions::BusyPolicy::kWait;
    spec.mutations.assign(4, mutation);
    cases.push_back(std::move(spec));
    return &cases.back();
  };
  constexpr size_t k64K = 64 << 10, k1M = 1 << 20, k16M = 16 << 20;
  const bool kTiny = true, kEager = false, kLazy = true;
  const int kWaitEach = 0, kPipelined = 1, kSkip = 2;
  // The encoder's 8 output buffers against 8 and 9 shard files.
  add("EightShardsZstd", ModulesLayout(8), SaveMode::kZstd, PoolSize::kGrow, k64K, kTiny, kEager,
      kWaitEach, Mutation::kDense);
  add("NineShardsZstd", ModulesLayout(9), SaveMode::kZstd, PoolSize::kGrow, k64K, kTiny, kEager,
      kWaitEach, Mutation::kDense);
  add("EightShardsExactDelta", ModulesLayout(8), SaveMode::kExact, PoolSize::kGrow, k64K, kTiny,
      kEager, kWaitEach, Mutation::kSparse);
  add("NineShardsExactDelta", ModulesLayout(9), SaveMode::kExact, PoolSize::kGrow, k64K, kTiny,
      kEager, kWaitEach, Mutation::kSparse);
  add("NineShardsTopKDeltaLazy", ModulesLayout(9), SaveMode::kTopK, PoolSize::kGrow, k64K, kTiny,
      kLazy, kWaitEach, Mutation::kDense);
  // Realistic states in many shards with delta or zstd encoding.
  add("GptManyShardsExactLazyPipelined", GptLayout(GptConfig{}), SaveMode::kExact, PoolSize::kGrow,
      k64K, kTiny, kLazy, kPipelined, Mutation::kSparse);
  add("GptMixedManyShardsZstdTopK", GptLayout(GptConfig{.mixed = true}), SaveMode::kZstdTopK,
      PoolSize::kGrow, k64K, kTiny, kEager, kWaitEach, Mutation::kDense);
  add("ResNetManyShardsZstdOneChunkPool", ResNetLayout(ResNetConfig{}), SaveMode::kZstd,
      PoolSize::kOneChunk, k64K, kTiny, kEager, kWaitEach, Mutation::kDense);
  add("TinyTensorsManyShardsZstdExactSkip", TinyTensorsLayout(10000), SaveMode::kZstdExact,
      PoolSize::kLessThanState, k64K, kTiny, kLazy, kSkip, Mutation::kDense);
  add("GptManyShardsZstdExact16MChunksOneChunkPool", GptLayout(GptConfig{}), SaveMode::kZstdExact,
      PoolSize::kOneChunk, k16M, kTiny, kEager, kPipelined, Mutation::kSparse);
  // Deltas streaming through pools smaller than the state: at exactly the
  // size a delta needs (its largest tensor's chunks + 2), and one chunk more.
  const StateLayout large = LargeTensorLayout(3 << 20);
  const size_t need = (large.largest() + k64K - 1) / k64K + 2;
  add("LargeExactDeltaPoolExactlyLargestPlusTwoChunks", large, SaveMode::kExact, PoolSize::kBytes,
      k64K, !kTiny, kEager, kWaitEach, Mutation::kSparse)->staging_bytes = need * k64K;
  add("LargeTopKDeltaPoolLargestPlusThreeChunksLazy", large, SaveMode::kTopK, PoolSize::kBytes,
      k64K, !kTiny, kLazy, kPipelined, Mutation::kDense)->staging_bytes = (need + 1) * k64K;
  add("LargeZstdExactPoolSmallerThanTensor", large, SaveMode::kZstdExact,
      PoolSize::kLessThanTensor, k1M, !kTiny, kEager, kPipelined, Mutation::kSparse);
  add("LargeFullOneChunkPoolSkip", large, SaveMode::kFull, PoolSize::kOneChunk, k64K, kTiny, kLazy,
      kSkip, Mutation::kDense);
  return cases;
}

std::string CaseName(const ::testing::TestParamInfo<CaseSpec>& info) {
  std::string name = info.param.label;
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name;
}

class RealisticStateTest : public ::testing::TestWithParam<CaseSpec> {};

TEST_P(RealisticStateTest, EveryCommittedStepRestoresWhatWasSaved) { RunCase(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Pairwise, RealisticStateTest, ::testing::ValuesIn(PairwiseCases()),
                         CaseName);
INSTANTIATE_TEST_SUITE_P(Risky, RealisticStateTest, ::testing::ValuesIn(RiskyCases()), CaseName);

class RandomStateTest : public ::testing::TestWithParam<uint64_t> {};

TEST_P(RandomStateTest, EveryCommittedStepRestoresWhatWasSaved) { RunCase(RandomCase(GetParam())); }

INSTANTIATE_TEST_SUITE_P(Seeds, RandomStateTest, ::testing::Range<uint64_t>(1, 9),
                         [](const auto& info) { return absl::StrCat("seed", info.param); });

TEST(PairwiseDesignTest, CoversEveryPairOfValuesThatCanOccurTogether) {
  std::set<Pair> feasible, covered;
  for (const Row& r : AllRows()) {
    if (Feasible(r)) AddPairs(r, feasible);
  }
  for (const Row& r : Rows()) {
    EXPECT_TRUE(Feasible(r)) << RowName(r);
    AddPairs(r, covered);
  }
  for (const Pair& p : feasible) {
    EXPECT_TRUE(covered.count(p)) << kFactorNames[std::get<0>(p)] << "=" << std::get<1>(p)
                                  << " with " << kFactorNames[std::get<2>(p)] << "="
                                  << std::get<3>(p);
  }
  // Every value of every factor occurs with every mode.
  for (int f = 0; f < kFactors; ++f) {
    for (int v = 0; v < kLevels[f]; ++v) {
      for (int m = 0; m < kLevels[1] && f != 1; ++m) {
        EXPECT_TRUE(covered.count(f < 1 ? Pair{f, v, 1, m} : Pair{1, m, f, v}))
            << kFactorNames[f] << "=" << v << " never runs in mode " << SaveModeName(kModes[m]);
      }
    }
  }
  std::printf("%zu pairwise rows cover %zu pairs\n", Rows().size(), covered.size());
}

}  // namespace
}  // namespace ckpt::testing
