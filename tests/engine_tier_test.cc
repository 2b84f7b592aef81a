// Upload behind the save from C++ (`EngineOptions::tier`, ckpt/tier.h),
// against moto's S3 server: every committed save is published to the bucket
// in the background and reported per step; what comes back from the bucket
// is what was saved, bit for bit; an upload failure never fails a save; a
// failed save is not uploaded and tells the other ranks at once; ranks
// upload their parts and one marker is written; ranks that share no file
// system produce one checkpoint in the bucket and prune their older copies;
// uploads wait while a retention job holds the bucket's lease.
#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "ckpt/catalog.h"
#include "ckpt/engine.h"
#include "ckpt/object_store.h"
#include "ckpt/object_tier.h"
#include "ckpt/reader.h"
#include "ckpt/tier.h"
#include "distributed_ranks.h"
#include "gtest/gtest.h"
#include "moto_server.h"
#include "test_util.h"
#include "testing/fault_injection_file_system.h"

namespace ckpt {
namespace {

using testing::OwnedTensor;
using testing::RandomTensor;
using testing::ScratchDir;

constexpr absl::Duration kUploadDeadline = absl::Seconds(120);

class EngineTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto& server = testing::SharedMotoServer();
    bucket_ = testing::NewTestBucket();
    url_ = absl::StrCat("s3://", bucket_, "/runs/a");
    auto store = OpenObjectStore(url_, server.Options());
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *store;
    server.ExportEnvironment();  // the engine opens its tier by URL alone
    root_ = dir_.Join("root");
  }

  EngineOptions Tiered(int full_every) {
    EngineOptions options = testing::SmallChunks();
    options.delta.mode = DeltaOptions::Mode::kExact;
    options.delta.full_every = full_every;
    options.tier.url = url_;
    options.tier.streams = 4;
    options.tier.part_bytes = 5 << 20;  // S3's smallest: the big tensor goes up in parts
    return options;
  }

  // A state with one tensor above a part (a multipart upload) and small ones.
  static std::vector<OwnedTensor> State(uint64_t seed) {
    return {RandomTensor("embed.weight", DType::kFloat32, {6 << 18}, seed + 1),  // 6 MiB
            RandomTensor("block.0.w", DType::kBFloat16, {300, 7}, seed + 2),
            RandomTensor("block.0.b", DType::kFloat32, {77}, seed + 3)};
  }
  static void Perturb(std::vector<OwnedTensor>& state, uint64_t seed) {
    std::mt19937_64 rng(seed);
    for (auto& t : state) {
      for (int i = 0; i < 40; ++i) t.bytes[rng() % t.bytes.size()] ^= 0x21;
    }
  }

  std::vector<int64_t> Marked() {
    auto steps = ListCommittedSteps(*store_, "runs/a");
    EXPECT_TRUE(steps.ok()) << steps.status();
    return steps.ok() ? *steps : std::vector<int64_t>{};
  }

  ScratchDir dir_;
  std::string root_, bucket_, url_;
  std::shared_ptr<ObjectStore> store_;
};

TEST_F(EngineTierTest, EachCommittedSaveIsUploadedBehindItAndRestoresFromTheBucketAsSaved) {
  auto engine = Engine::Open(root_, Tiered(3));
  ASSERT_TRUE(engine.ok()) << engine.status();
  ASSERT_NE((*engine)->tier(), nullptr);
  EXPECT_EQ((*engine)->tier()->url(), url_);
  EXPECT_EQ((*engine)->tier()->Status(1).state, TierState::kUnknown);
  std::vector<OwnedTensor> state = State(10);
  std::vector<std::vector<OwnedTensor>> saved;
  for (int step = 1; step <= 5; ++step) {  // 1 full, 2-3 deltas, 4 full, 5 delta
    Perturb(state, step);
    auto handle = (*engine)->SaveAsync(step, testing::Views(state));
    ASSERT_TRUE(handle.ok()) << handle.status();
    ASSERT_TRUE(testing::WaitOrDie(**handle, kUploadDeadline, absl::StrCat("step ", step)).ok());
    saved.push_back(state);
  }
  for (int step = 1; step <= 5; ++step) {
    const TierStepStatus s = (*engine)->tier()->WaitFor(step, kUploadDeadline);
    ASSERT_EQ(s.state, TierState::kDurable) << "step " << step << ": " << TierStateName(s.state) << " " << s.error;
    EXPECT_FALSE(s.already_there);
    EXPECT_GE(s.files, 2u);
    EXPECT_GT(s.bytes, 0u);
    EXPECT_GE(s.attempts, 1);
  }
  EXPECT_TRUE((*engine)->tier()->WaitIdle(kUploadDeadline));
  EXPECT_EQ((*engine)->tier()->StatusAll().size(), 5u);
  ASSERT_TRUE((*engine)->Close().ok());
  EXPECT_EQ(Marked(), (std::vector<int64_t>{1, 2, 3, 4, 5}));
  auto marker = ReadCommitMarker(*store_, "runs/a", 5);
  ASSERT_TRUE(marker.ok() && marker->has_value());
  EXPECT_TRUE((*marker)->delta);
  EXPECT_EQ((*marker)->base_step, 4);
  // The local copies stay (the tier is a copy, not a move) ...
  EXPECT_EQ(*ListSteps(root_), (std::vector<int64_t>{1, 2, 3, 4, 5}));
  // ... and the bucket alone gives back every step as it was saved.
  std::filesystem::remove_all(root_);
  for (int step = 1; step <= 5; ++step) testing::ExpectCheckpointEquals(url_, step, saved[step - 1]);
  // No multipart upload left behind.
  auto uploads = store_->ListMultipartUploads("runs/a/");
  ASSERT_TRUE(uploads.ok()) << uploads.status();
  EXPECT_TRUE(uploads->empty());
}

// Close(kWait) returns only once what committed is in the bucket.
TEST_F(EngineTierTest, CloseWaitsForTheUploads) {
  auto engine = Engine::Open(root_, Tiered(10));
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::vector<OwnedTensor> state = State(20);
  for (int step = 1; step <= 3; ++step) {
    Perturb(state, step);
    auto handle = (*engine)->SaveAsync(step, testing::Views(state));
    ASSERT_TRUE(handle.ok()) << handle.status();
  }
  ASSERT_TRUE((*engine)->Close().ok());
  for (int step = 1; step <= 3; ++step) {
    EXPECT_EQ((*engine)->tier()->Status(step).state, TierState::kDurable) << step;
  }
  EXPECT_EQ(Marked(), (std::vector<int64_t>{1, 2, 3}));
  testing::ExpectCheckpointEquals(url_, 3, state);
}

// Close(kCancel) drops the uploads not started: they are reported
// cancelled and have no marker; the one in progress finishes or is
// cancelled, and Close returns within the deadline either way.
TEST_F(EngineTierTest, CloseWithCancelDropsTheUploadsNotStarted) {
  EngineOptions options = Tiered(1);
  options.tier.streams = 1;
  options.tier.max_stream_bytes_per_second = 4 << 20;  // each step ~1.5 s
  auto engine = Engine::Open(root_, options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::vector<OwnedTensor> state = State(30);
  for (int step = 1; step <= 4; ++step) {
    Perturb(state, step);
    auto handle = (*engine)->SaveAsync(step, testing::Views(state));
    ASSERT_TRUE(handle.ok()) << handle.status();
    ASSERT_TRUE(testing::WaitOrDie(**handle, kUploadDeadline, absl::StrCat("step ", step)).ok());
  }
  const absl::Time start = absl::Now();
  ASSERT_TRUE((*engine)->Close(Engine::CloseMode::kCancel).ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  const std::map<int64_t, TierStepStatus> all = (*engine)->tier()->StatusAll();
  ASSERT_EQ(all.size(), 4u);
  std::vector<int64_t> durable, cancelled;
  for (const auto& [step, s] : all) {
    ASSERT_TRUE(s.state == TierState::kDurable || s.state == TierState::kCancelled)
        << step << ": " << TierStateName(s.state) << " " << s.error;
    (s.state == TierState::kDurable ? durable : cancelled).push_back(step);
  }
  EXPECT_FALSE(cancelled.empty());  // 4 x 6 MiB at 4 MiB/s cannot be done at once
  EXPECT_EQ(Marked(), durable);
}

// A bucket that does not exist: every save commits locally; each upload is
// reported failed, naming the bucket, and none is retried in vain.
TEST_F(EngineTierTest, AnUploadThatFailsNeverFailsTheSaveAndIsReported) {
  EngineOptions options = Tiered(2);
  options.tier.url = absl::StrCat("s3://", bucket_, "-missing/runs/a");
  auto engine = Engine::Open(root_, options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::vector<OwnedTensor> state = State(40);
  for (int step = 1; step <= 2; ++step) {
    Perturb(state, step);
    ASSERT_TRUE((*engine)->Save(step, testing::Views(state)).ok());
  }
  for (int step = 1; step <= 2; ++step) {
    const TierStepStatus s = (*engine)->tier()->WaitFor(step, kUploadDeadline);
    ASSERT_EQ(s.state, TierState::kFailed) << step << ": " << TierStateName(s.state);
    EXPECT_TRUE(absl::StrContains(s.error.message(), bucket_ + "-missing")) << s.error;
    EXPECT_TRUE(absl::StrContains(s.error.message(), absl::StrCat("upload of step ", step))) << s.error;
    EXPECT_EQ(s.attempts, 1) << s.error;  // a missing bucket is not transient
  }
  ASSERT_TRUE((*engine)->Close().ok());
  EXPECT_EQ(*ListSteps(root_), (std::vector<int64_t>{1, 2}));
  testing::ExpectCheckpointEquals(root_, 2, state);
}

// A retention job (ckpt-retain tiering into the same prefix) holds the
// bucket's lease: the uploads behind the saves wait for it instead of
// failing after their few tries, and go up once it is released.
TEST_F(EngineTierTest, UploadsWaitWhileARetentionJobHoldsTheLeaseThenGoUp) {
  auto retention = ObjectLease::Acquire(store_, "runs/a", "ckpt-retain pid 1 on cron", absl::Minutes(5));
  ASSERT_TRUE(retention.ok()) << retention.status();
  auto engine = Engine::Open(root_, Tiered(2));
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::vector<OwnedTensor> state = State(70);
  for (int step = 1; step <= 2; ++step) {
    Perturb(state, step);
    ASSERT_TRUE((*engine)->Save(step, testing::Views(state)).ok());
  }
  // Longer than the three tries' pauses (0.5 s + 1 s): still waiting.
  absl::SleepFor(absl::Seconds(3));
  EXPECT_EQ((*engine)->tier()->Status(1).state, TierState::kUploading);
  EXPECT_EQ((*engine)->tier()->Status(2).state, TierState::kPending);
  EXPECT_TRUE(Marked().empty());
  retention->reset();  // the job ends
  for (int step = 1; step <= 2; ++step) {
    const TierStepStatus s = (*engine)->tier()->WaitFor(step, kUploadDeadline);
    ASSERT_EQ(s.state, TierState::kDurable) << step << ": " << TierStateName(s.state) << " " << s.error;
    EXPECT_EQ(s.attempts, 1);  // the wait was no try
  }
  ASSERT_TRUE((*engine)->Close().ok());
  EXPECT_EQ(Marked(), (std::vector<int64_t>{1, 2}));
  testing::ExpectCheckpointEquals(url_, 2, state);
}

// Past `lease_wait` the upload fails naming the holder and the wait, once
// (not three times over); the save stands, and Close(kCancel) ends a wait
// at once.
TEST_F(EngineTierTest, ALeaseHeldPastTheWaitFailsTheUploadNamingItsHolder) {
  auto retention = ObjectLease::Acquire(store_, "runs/a", "ckpt-retain pid 1 on cron", absl::Minutes(5));
  ASSERT_TRUE(retention.ok()) << retention.status();
  EngineOptions options = Tiered(1);
  options.tier.lease_wait = absl::Seconds(2);
  auto engine = Engine::Open(root_, options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::vector<OwnedTensor> state = State(80);
  const absl::Time start = absl::Now();
  ASSERT_TRUE((*engine)->Save(1, testing::Views(state)).ok());
  const TierStepStatus s = (*engine)->tier()->WaitFor(1, kUploadDeadline);
  ASSERT_EQ(s.state, TierState::kFailed) << TierStateName(s.state);
  EXPECT_TRUE(IsLeaseHeld(s.error)) << s.error;
  EXPECT_TRUE(absl::StrContains(s.error.message(), "ckpt-retain pid 1 on cron")) << s.error;
  EXPECT_TRUE(absl::StrContains(s.error.message(), "(waited ")) << s.error;
  EXPECT_EQ(s.attempts, 1);
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  // A second save waits in turn; cancelling ends its wait at once.
  ASSERT_TRUE((*engine)->Save(2, testing::Views(state)).ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while ((*engine)->tier()->Status(2).state != TierState::kUploading && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  const absl::Time cancel = absl::Now();
  ASSERT_TRUE((*engine)->Close(Engine::CloseMode::kCancel).ok());
  EXPECT_LT(absl::Now() - cancel, absl::Seconds(1));
  EXPECT_TRUE(Marked().empty());
  EXPECT_EQ(*ListSteps(root_), (std::vector<int64_t>{1, 2}));
}

// A save that fails (EIO) is reported "not uploaded" with its error; the
// next one is uploaded, and the bucket holds only the committed steps.
TEST_F(EngineTierTest, AFailedSaveIsNotUploadedAndTheNextOneIs) {
  auto fs = std::make_shared<testing::FaultInjectionFileSystem>(PosixFileSystem());
  EngineOptions options = Tiered(1);
  options.fs = fs;
  auto engine = Engine::Open(root_, options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::vector<OwnedTensor> state = State(50);
  ASSERT_TRUE((*engine)->Save(1, testing::Views(state)).ok());
  // (The upload reads the files through `fs` too: the fault is for the save.)
  ASSERT_EQ((*engine)->tier()->WaitFor(1, kUploadDeadline).state, TierState::kDurable);
  Perturb(state, 2);
  fs->FailAt(fs->call_count() + 3, testing::Fault::kEio);
  auto failed = (*engine)->Save(2, testing::Views(state));
  ASSERT_FALSE(failed.ok());
  fs->ClearFaults();
  Perturb(state, 3);
  ASSERT_TRUE((*engine)->Save(3, testing::Views(state)).ok());
  const TierStepStatus two = (*engine)->tier()->WaitFor(2, kUploadDeadline);
  EXPECT_EQ(two.state, TierState::kNotUploaded) << TierStateName(two.state);
  EXPECT_FALSE(two.error.ok());
  EXPECT_EQ((*engine)->tier()->WaitFor(3, kUploadDeadline).state, TierState::kDurable);
  ASSERT_TRUE((*engine)->Close().ok());
  EXPECT_EQ(Marked(), (std::vector<int64_t>{1, 3}));
  testing::ExpectCheckpointEquals(url_, 3, state);
}

TEST_F(EngineTierTest, TierOptionsOutOfRangeFailOpenNamingTheFieldAndTouchNothing) {
  struct Case {
    std::function<void(TierOptions&)> set;
    std::string names;
  };
  const std::vector<Case> cases = {
      {[](TierOptions& t) { t.url = "/mnt/cold"; }, "tier.url"},
      {[](TierOptions& t) { t.url = "s3://"; }, "tier.url"},
      {[](TierOptions& t) { t.streams = 0; }, "tier.streams"},
      {[](TierOptions& t) { t.part_bytes = 1 << 20; }, "tier.part_bytes"},
      {[](TierOptions& t) { t.max_stream_bytes_per_second = -1; }, "tier.max_stream_bytes_per_second"},
      {[](TierOptions& t) { t.attempts = 0; }, "tier.attempts"},
      {[](TierOptions& t) { t.lease_wait = absl::Seconds(-1); }, "tier.lease_wait"},
      {[](TierOptions& t) { t.storage_class = "GLACIER"; }, "tier.storage_class"},
  };
  for (const Case& c : cases) {
    EngineOptions options = Tiered(1);
    c.set(options.tier);
    auto engine = Engine::Open(root_, options);
    ASSERT_FALSE(engine.ok()) << c.names;
    EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument) << engine.status();
    EXPECT_TRUE(absl::StrContains(engine.status().message(), c.names)) << engine.status();
    EXPECT_FALSE(std::filesystem::exists(root_)) << c.names;
  }
  // Without a tier there is none.
  EngineOptions plain = testing::SmallChunks();
  auto engine = Engine::Open(root_, plain);
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_EQ((*engine)->tier(), nullptr);
}

// A bucket that cannot be reached as configured (here an endpoint that is
// not a URL) fails Open with the store's error, before any save, and leaves
// ROOT free for the next engine.
TEST_F(EngineTierTest, ATierThatCannotBeOpenedFailsOpenAndLeavesTheRootFree) {
  const std::string endpoint = getenv("AWS_ENDPOINT_URL");
  setenv("AWS_ENDPOINT_URL", "ftp://127.0.0.1:1", 1);
  auto engine = Engine::Open(root_, Tiered(1));
  setenv("AWS_ENDPOINT_URL", endpoint.c_str(), 1);
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument) << engine.status();
  EXPECT_TRUE(absl::StrContains(engine.status().message(), url_)) << engine.status();
  EXPECT_TRUE(absl::StrContains(engine.status().message(), "ftp://127.0.0.1:1")) << engine.status();
  auto again = Engine::Open(root_, Tiered(1));
  ASSERT_TRUE(again.ok()) << again.status();
  std::vector<OwnedTensor> state = State(100);
  ASSERT_TRUE((*again)->Save(1, testing::Views(state)).ok());
  EXPECT_EQ((*again)->tier()->WaitFor(1, kUploadDeadline).state, TierState::kDurable);
}

// Ranks on one ROOT: each uploads its own part, rank 0 writes one marker;
// every rank's part comes back from the bucket as it was saved.
TEST_F(EngineTierTest, RanksUploadTheirPartsAndOneMarkerIsWritten) {
  constexpr int kWorld = 3;
  EngineOptions base = Tiered(2);
  std::vector<std::vector<OwnedTensor>> states;
  for (int r = 0; r < kWorld; ++r) states.push_back(testing::RankState(r, 60));
  {
    testing::Ranks ranks(root_, kWorld, base, absl::Seconds(30));
    for (int step = 1; step <= 3; ++step) {  // full, delta, full
      for (int r = 0; r < kWorld; ++r) testing::Step(states[r], r, step);
      std::vector<absl::Status> saved = ranks.Save({step, step, step}, states);
      for (int r = 0; r < kWorld; ++r) ASSERT_TRUE(saved[r].ok()) << "rank " << r << ": " << saved[r];
    }
    for (int r = 0; r < kWorld; ++r) {
      for (int step = 1; step <= 3; ++step) {
        const TierStepStatus s = ranks.engine(r).tier()->WaitFor(step, kUploadDeadline);
        ASSERT_EQ(s.state, TierState::kDurable)
            << "rank " << r << " step " << step << ": " << TierStateName(s.state) << " " << s.error;
        EXPECT_GT(s.bytes, 0u);
      }
    }
    ranks.CloseAll();
  }
  EXPECT_EQ(Marked(), (std::vector<int64_t>{1, 2, 3}));
  auto marker = ReadCommitMarker(*store_, "runs/a", 3);
  ASSERT_TRUE(marker.ok() && marker->has_value());
  EXPECT_EQ((*marker)->world_size, kWorld);
  std::filesystem::remove_all(root_);
  for (int r = 0; r < kWorld; ++r) testing::ExpectRankPart(url_, 3, r, kWorld, states[r]);
}

// Ranks that share no file system: one checkpoint per step in the bucket,
// each rank's part as saved; once a step is durable, each rank's older
// copies that its chain does not need are gone.
TEST_F(EngineTierTest, RanksThatShareNoFileSystemGetOneCheckpointInTheBucketAndPruneTheirCopies) {
  constexpr int kWorld = 2;
  EngineOptions base = Tiered(2);
  base.distributed.shared_root = false;
  std::filesystem::create_directories(root_);  // the ranks' directories go in it
  std::vector<std::vector<OwnedTensor>> states;
  for (int r = 0; r < kWorld; ++r) states.push_back(testing::RankState(r, 70));
  std::vector<std::vector<std::vector<OwnedTensor>>> saved(kWorld);
  {
    testing::Ranks ranks(root_, kWorld, base, absl::Seconds(30));
    for (int step = 1; step <= 4; ++step) {  // full, delta, full, delta
      for (int r = 0; r < kWorld; ++r) {
        testing::Step(states[r], r, step);
        saved[r].push_back(states[r]);
      }
      std::vector<absl::Status> done = ranks.Save({step, step}, states);
      for (int r = 0; r < kWorld; ++r) ASSERT_TRUE(done[r].ok()) << "rank " << r << ": " << done[r];
      for (int r = 0; r < kWorld; ++r) {
        const TierStepStatus s = ranks.engine(r).tier()->WaitFor(step, kUploadDeadline);
        ASSERT_EQ(s.state, TierState::kDurable)
            << "rank " << r << " step " << step << ": " << TierStateName(s.state) << " " << s.error;
      }
    }
    ranks.CloseAll();
  }
  EXPECT_EQ(Marked(), (std::vector<int64_t>{1, 2, 3, 4}));
  for (int r = 0; r < kWorld; ++r) {  // step 4 is a delta of 3: both stay, 1-2 are gone
    EXPECT_EQ(*ListSteps(testing::Ranks::RankRoot(root_, r)), (std::vector<int64_t>{3, 4})) << "rank " << r;
  }
  std::filesystem::remove_all(root_);
  for (int step = 1; step <= 4; ++step) {
    for (int r = 0; r < kWorld; ++r) testing::ExpectRankPart(url_, step, r, kWorld, saved[r][step - 1]);
  }
}

// Rank 1 fails to write its part of a step: the save fails on every rank,
// each says so at once (rank 0 in place of its "go", rank 1 as its part),
// so no rank waits out its patience (an hour here); no marker is written
// for it, and the next step, whose keys are fresh, is uploaded by both.
TEST_F(EngineTierTest, ASaveThatFailedIsUploadedByNoRankAndTheNextStepIs) {
  constexpr int kWorld = 2;
  EngineOptions base = Tiered(1);
  auto fs1 = std::make_shared<testing::FaultInjectionFileSystem>(PosixFileSystem());
  std::vector<std::vector<OwnedTensor>> states;
  for (int r = 0; r < kWorld; ++r) states.push_back(testing::RankState(r, 80));
  testing::Ranks ranks(root_, kWorld, base, absl::Seconds(30), [&](int r) -> std::shared_ptr<FileSystem> {
    return r == 1 ? fs1 : PosixFileSystem();
  });
  ASSERT_TRUE(ranks.Save({1, 1}, states)[0].ok());
  for (int r = 0; r < kWorld; ++r) {  // (rank 1's upload reads through fs1: the fault is for the save)
    ASSERT_EQ(ranks.engine(r).tier()->WaitFor(1, kUploadDeadline).state, TierState::kDurable) << r;
  }
  fs1->FailAt(fs1->call_count() + 2, testing::Fault::kEio);
  for (int r = 0; r < kWorld; ++r) testing::Step(states[r], r, 2);
  std::vector<absl::Status> two = ranks.Save({2, 2}, states);
  EXPECT_FALSE(two[0].ok());
  EXPECT_FALSE(two[1].ok());
  fs1->ClearFaults();
  const absl::Time start = absl::Now();
  for (int r = 0; r < kWorld; ++r) {
    const TierStepStatus s = ranks.engine(r).tier()->WaitFor(2, kUploadDeadline);
    EXPECT_EQ(s.state, TierState::kNotUploaded) << "rank " << r << ": " << TierStateName(s.state);
  }
  for (int r = 0; r < kWorld; ++r) testing::Step(states[r], r, 3);
  std::vector<absl::Status> three = ranks.Save({3, 3}, states);
  ASSERT_TRUE(three[0].ok() && three[1].ok()) << three[0] << " / " << three[1];
  for (int r = 0; r < kWorld; ++r) {
    const TierStepStatus s = ranks.engine(r).tier()->WaitFor(3, kUploadDeadline);
    EXPECT_EQ(s.state, TierState::kDurable) << "rank " << r << ": " << TierStateName(s.state) << " " << s.error;
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(60));
  ranks.CloseAll();
  EXPECT_EQ(Marked(), (std::vector<int64_t>{1, 3}));
}

// Rank 1 closes with kCancel while its uploads are queued: it tells rank 0,
// whose uploads of those steps fail at once naming rank 1 (not after the
// ranks' patience, an hour here), while the step in progress completes.
TEST_F(EngineTierTest, ARankThatCancelsItsUploadsTellsRankZeroAtOnce) {
  constexpr int kWorld = 2;
  EngineOptions base = Tiered(1);
  base.tier.streams = 1;
  base.tier.max_stream_bytes_per_second = 64 << 10;  // a rank's part: seconds
  std::vector<std::vector<OwnedTensor>> states;
  for (int r = 0; r < kWorld; ++r) states.push_back(testing::RankState(r, 90));
  testing::Ranks ranks(root_, kWorld, base, absl::Seconds(30));
  for (int step = 1; step <= 3; ++step) {
    for (int r = 0; r < kWorld; ++r) testing::Step(states[r], r, step);
    std::vector<absl::Status> saved = ranks.Save({step, step}, states);
    ASSERT_TRUE(saved[0].ok() && saved[1].ok()) << saved[0] << " / " << saved[1];
  }
  const absl::Time start = absl::Now();
  ASSERT_TRUE(ranks.engine(1).Close(Engine::CloseMode::kCancel).ok());
  for (int step = 2; step <= 3; ++step) {
    EXPECT_EQ(ranks.engine(1).tier()->Status(step).state, TierState::kCancelled) << step;
    const TierStepStatus s = ranks.engine(0).tier()->WaitFor(step, kUploadDeadline);
    ASSERT_EQ(s.state, TierState::kFailed) << step << ": " << TierStateName(s.state);
    EXPECT_TRUE(absl::StrContains(s.error.message(), "rank 1")) << s.error;
    EXPECT_TRUE(absl::StrContains(s.error.message(), "kCancel")) << s.error;
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(90));
  const TierStepStatus first = ranks.engine(0).tier()->Status(1);
  EXPECT_TRUE(first.state == TierState::kDurable || first.state == TierState::kFailed) << TierStateName(first.state);
  ranks.CloseAll();
  std::vector<int64_t> marked = Marked();
  EXPECT_TRUE(marked.empty() || marked == std::vector<int64_t>{1}) << marked.size();
}

}  // namespace
}  // namespace ckpt
