// Ranks as threads of one process, for tests of multi-rank checkpoints
// (ckpt/distributed.h): `Ranks` opens one engine per rank on one root with a
// shared in-process store; `RankState` is a state shaped like DDP training's
// (replicated model and optimizer tensors, a rank-local RNG state, a tensor
// only that rank has).
#ifndef CKPT_TESTS_DISTRIBUTED_RANKS_H_
#define CKPT_TESTS_DISTRIBUTED_RANKS_H_

#include <algorithm>
#include <filesystem>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ckpt/distributed.h"
#include "ckpt/engine.h"
#include "ckpt/reader.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace ckpt::testing {

inline constexpr absl::Duration kRankDeadline = absl::Seconds(60);

// One rank's state: replicated tensors (identical on every rank), a
// rank-local one with the same name everywhere, and one only this rank has.
inline std::vector<OwnedTensor> RankState(int rank, uint64_t seed) {
  std::vector<OwnedTensor> state = {
      RandomTensor("model.embed.weight", DType::kFloat32, {256, 128}, seed + 1),
      RandomTensor("model.block.0.w", DType::kBFloat16, {128, 128}, seed + 2),
      RandomTensor("model.block.0.b", DType::kFloat32, {128}, seed + 3),
      RandomTensor("optim.exp_avg.0", DType::kFloat32, {128, 128}, seed + 4),
      RandomTensor("rng.state", DType::kUInt8, {816}, seed + 100 + rank),
      RandomTensor(absl::StrCat("shard.", rank, ".w"), DType::kFloat16, {64, 96}, seed + 200 + rank),
  };
  return state;
}

inline std::vector<TensorView> Placed(const std::vector<OwnedTensor>& state) {
  std::vector<TensorView> views = Views(state);
  for (TensorView& v : views) {
    if (absl::StartsWith(v.name, "model.") || absl::StartsWith(v.name, "optim.")) {
      v.placement = TensorPlacement::kReplicated;
    } else if (v.name == "rng.state") {
      v.placement = TensorPlacement::kRankLocal;
    }
  }
  return views;
}

// Changes a few bytes of every tensor, the same way on every rank for the
// replicated ones (as an optimizer step would).
inline void Step(std::vector<OwnedTensor>& state, int rank, uint64_t seed) {
  for (OwnedTensor& t : state) {
    const bool replicated = absl::StartsWith(t.name, "model.") || absl::StartsWith(t.name, "optim.");
    std::mt19937_64 rng(seed * 31 + (replicated ? 0 : rank + 1) + std::hash<std::string>()(t.name));
    for (int i = 0; i < 25; ++i) t.bytes[rng() % t.bytes.size()] ^= 0x3C;
  }
}

// An in-process store that says when someone first waits for a key ending
// in `suffix` (a Get longer than a peek): the event a test waits on instead
// of sleeping until a rank is probably blocked.
class WaitSignallingStore final : public CoordinationStore {
 public:
  explicit WaitSignallingStore(std::string suffix) : suffix_(std::move(suffix)) {}
  absl::Status Set(const std::string& key, const std::string& value) override {
    return base_->Set(key, value);
  }
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    if (timeout > absl::Milliseconds(1) && absl::EndsWith(key, suffix_)) {
      std::call_once(signalled_, [&] { waited_.set_value(); });
    }
    return base_->Get(key, timeout);
  }
  absl::StatusOr<std::string> SetIfAbsent(const std::string& key, const std::string& value) override {
    return base_->SetIfAbsent(key, value);
  }
  // True once a wait began within `deadline`.
  bool AwaitWaiter(absl::Duration deadline) {
    return waiting_.wait_for(absl::ToChronoSeconds(deadline)) == std::future_status::ready;
  }

 private:
  const std::shared_ptr<CoordinationStore> base_ = NewInProcessStore();
  const std::string suffix_;
  std::once_flag signalled_;
  std::promise<void> waited_;
  std::future<void> waiting_ = waited_.get_future();
};

// Options of rank `rank` of `world`, coordinating through `store`: for
// tests that open the ranks' engines one by one.
inline EngineOptions RankOptions(std::shared_ptr<CoordinationStore> store, int world, int rank,
                                 absl::Duration commit_timeout = absl::Seconds(30)) {
  EngineOptions options;
  options.distributed.world_size = world;
  options.distributed.rank = rank;
  options.distributed.store = std::move(store);
  options.distributed.commit_timeout = commit_timeout;
  return options;
}

class Ranks {
 public:
  // Opens `world` engines on `root`, each on its own thread (a rank's Open
  // waits for rank 0's), sharing `store` (default: a new in-process one).
  // With `base.distributed.shared_root` false, each rank opens a directory
  // of its own, `RankRoot(root, r)`, as ranks on machines that share no
  // file system would.
  Ranks(const std::string& root, int world, EngineOptions base, absl::Duration commit_timeout,
        std::function<std::shared_ptr<FileSystem>(int)> fs_for_rank = nullptr,
        std::shared_ptr<CoordinationStore> store = nullptr)
      : root_(root), store_(store ? std::move(store) : NewInProcessStore()) {
    engines_.resize(world);
    std::vector<absl::Status> opened(world);
    Parallel(world, [&](int r) {
      EngineOptions options = base;
      options.distributed.rank = r;
      options.distributed.world_size = world;
      options.distributed.store = store_;
      options.distributed.key_prefix = "ckpt/test";
      options.distributed.commit_timeout = commit_timeout;
      if (fs_for_rank) options.fs = fs_for_rank(r);
      auto engine = Engine::Open(base.distributed.shared_root ? root : RankRoot(root, r), options);
      opened[r] = engine.status();
      if (engine.ok()) engines_[r] = std::move(*engine);
    });
    for (int r = 0; r < world; ++r) EXPECT_TRUE(opened[r].ok()) << "rank " << r << ": " << opened[r];
  }

  // As the Python Checkpointer names them: ROOT/rank-<5 digits>.
  static std::string RankRoot(const std::string& root, int r) { return absl::StrFormat("%s/rank-%05d", root, r); }

  int world() const { return static_cast<int>(engines_.size()); }
  Engine& engine(int r) { return *engines_[r]; }

  // Every rank in `ranks` saves `steps[r]` of `states[r]` at once; returns
  // each one's outcome (OK once committed).
  std::vector<absl::Status> Save(const std::vector<int64_t>& steps,
                                 const std::vector<std::vector<OwnedTensor>>& states,
                                 std::vector<int> ranks = {}) {
    if (ranks.empty()) {
      for (int r = 0; r < world(); ++r) ranks.push_back(r);
    }
    std::vector<absl::Status> outcome(world(), absl::UnknownError("did not save"));
    Parallel(static_cast<int>(ranks.size()), [&](int i) {
      const int r = ranks[i];
      std::vector<TensorView> views = Placed(states[r]);
      auto handle = engines_[r]->SaveAsync(steps[r], views);
      if (!handle.ok()) {
        outcome[r] = handle.status();
        return;
      }
      outcome[r] = WaitOrDie(**handle, kRankDeadline, absl::StrCat("rank ", r, " step ", steps[r]));
    });
    return outcome;
  }

  void CloseAll() {
    Parallel(world(), [&](int r) { (void)engines_[r]->Close(); });
  }

  static void Parallel(int n, const std::function<void(int)>& fn) {
    std::vector<std::thread> threads;
    for (int i = 0; i < n; ++i) threads.emplace_back(fn, i);
    for (std::thread& t : threads) t.join();
  }

 private:
  std::string root_;
  std::shared_ptr<CoordinationStore> store_;
  std::vector<std::unique_ptr<Engine>> engines_;
};

// What a bucket holds once every rank published its part: each rank's copy
// of every step, merged into one directory per step.
inline void MergeRankCopies(const std::string& root, int world, const std::string& merged) {
  for (int r = 0; r < world; ++r) {
    for (const auto& step : std::filesystem::directory_iterator(Ranks::RankRoot(root, r))) {
      const std::string name = step.path().filename().string();
      if (!absl::StartsWith(name, "step-")) continue;
      std::filesystem::create_directories(std::filesystem::path(merged) / name);
      for (const auto& f : std::filesystem::directory_iterator(step.path())) {
        std::filesystem::copy_file(f.path(), std::filesystem::path(merged) / name / f.path().filename(),
                                    std::filesystem::copy_options::overwrite_existing);
      }
    }
  }
}

// Rank `rank`'s part of `step` reads back as exactly `want`.
inline void ExpectRankPart(const std::string& root, int64_t step, int rank, int world,
                    const std::vector<OwnedTensor>& want) {
  ReaderOptions options;
  options.step = step;
  options.rank = rank;
  auto reader = Reader::Open(root, options);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->world_size(), world);
  EXPECT_EQ((*reader)->rank(), rank);
  ASSERT_EQ((*reader)->tensors().size(), want.size());
  for (const OwnedTensor& t : want) {
    auto got = (*reader)->Read(t.name);
    ASSERT_TRUE(got.ok()) << "rank " << rank << " step " << step << ": " << got.status();
    EXPECT_EQ(got->dtype, t.dtype) << t.name;
    EXPECT_EQ(got->shape, t.shape) << t.name;
    ASSERT_EQ(got->bytes.size(), t.bytes.size()) << t.name;
    EXPECT_TRUE(std::equal(t.bytes.begin(), t.bytes.end(), static_cast<const uint8_t*>(got->bytes.data())))
        << "rank " << rank << " step " << step << " tensor " << t.name << " differs";
  }
  EXPECT_TRUE((*reader)->Verify().ok());
}

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_DISTRIBUTED_RANKS_H_
