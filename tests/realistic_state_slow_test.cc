// The realistic-state suite at length (labelled "slow"): many random cases
// ($CKPT_RANDOM_SEEDS of them, 200 when unset; seeds from 1001: a failure
// reruns alone with --gtest_filter='*seed<N>'), and cases too big for
// the default run: pools smaller than a tensor with 16 MiB chunks (a 40 MiB
// tensor), and a GPT state with GPT-2's vocabulary. See
// realistic_state_test.cc for the design and realistic_states.h for what a
// case checks.
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "realistic_states.h"

namespace ckpt::testing {
namespace {

uint64_t RandomSeedCount() {
  const char* env = std::getenv("CKPT_RANDOM_SEEDS");
  const long long n = env != nullptr ? std::atoll(env) : 0;
  return n > 0 ? static_cast<uint64_t>(n) : 200;
}

class RandomStateSlowTest : public ::testing::TestWithParam<uint64_t> {};

TEST_P(RandomStateSlowTest, EveryCommittedStepRestoresWhatWasSaved) {
  RunCase(RandomCase(GetParam()));
}

INSTANTIATE_TEST_SUITE_P(Seeds, RandomStateSlowTest,
                         ::testing::Range<uint64_t>(1001, 1001 + RandomSeedCount()),
                         [](const auto& info) { return absl::StrCat("seed", info.param); });

std::vector<CaseSpec> BigCases() {
  std::vector<CaseSpec> cases;
  const StateLayout large = LargeTensorLayout(uint64_t{40} << 20);
  for (SaveMode mode : {SaveMode::kFull, SaveMode::kExact, SaveMode::kZstd}) {
    for (PoolSize pool : {PoolSize::kLessThanTensor, PoolSize::kLessThanState}) {
      CaseSpec spec;
      spec.label = absl::StrCat("Large40MiB16MChunks_", SaveModeName(mode), "_", PoolSizeName(pool));
      spec.layout = large;
      spec.seed = 9000 + cases.size();
      spec.mode = mode;
      spec.pool = pool;
      spec.chunk_bytes = size_t{16} << 20;
      spec.shard_min_bytes = kHugeShard;
      spec.shard_max_bytes = kHugeShard;
      spec.lazy = cases.size() % 2 == 1;
      spec.mutations = {Mutation::kSparse, Mutation::kDense, Mutation::kNone};
      cases.push_back(std::move(spec));
    }
  }
  CaseSpec gpt;
  gpt.label = "Gpt2VocabMixedExactDelta";
  gpt.layout = GptLayout(GptConfig{.vocab = 50257, .d_model = 64, .layers = 4, .mixed = true});
  gpt.seed = 9100;
  gpt.mode = SaveMode::kExact;
  gpt.pool = PoolSize::kLessThanState;
  gpt.chunk_bytes = size_t{1} << 20;
  gpt.shard_min_bytes = uint64_t{16} << 20;
  gpt.shard_max_bytes = uint64_t{256} << 20;  // the engine's defaults
  gpt.mutations = {Mutation::kSparse, Mutation::kSparse, Mutation::kDense, Mutation::kSparse};
  cases.push_back(gpt);
  return cases;
}

class BigStateSlowTest : public ::testing::TestWithParam<CaseSpec> {};

TEST_P(BigStateSlowTest, EveryCommittedStepRestoresWhatWasSaved) { RunCase(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Big, BigStateSlowTest, ::testing::ValuesIn(BigCases()),
                         [](const auto& info) {
                           std::string name = info.param.label;
                           for (char& c : name) c = c == '+' ? '_' : c;
                           return name;
                         });

}  // namespace
}  // namespace ckpt::testing
