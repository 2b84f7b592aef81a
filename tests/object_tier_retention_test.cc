// ckpt-retain with an s3:// cold tier, against moto: moving, compact-moving,
// one job per prefix, and a fault sweep over every request of a tiering run.
#include <filesystem>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "ckpt/catalog.h"
#include "ckpt/engine.h"
#include "ckpt/object_store.h"
#include "ckpt/object_tier.h"
#include "ckpt/reader.h"
#include "distributed_ranks.h"
#include "gtest/gtest.h"
#include "moto_server.h"
#include "retain/cli.h"
#include "retain/retention.h"
#include "test_util.h"
#include "testing/fault_injection_transport.h"
#include "util/hash.h"

namespace ckpt {
namespace {

using testing::FaultInjectionTransport;
using testing::OwnedTensor;
using testing::RandomTensor;
using testing::ScratchDir;
using testing::TransportFault;
using testing::Views;
using tools::RetentionAction;
using tools::RetentionPolicy;
using tools::RunRetention;

// Steps 1..4, a full save every `full_every`, chained deltas between.
void WriteSteps(const std::string& root, int full_every) {
  EngineOptions options = testing::SmallChunks();
  options.delta.mode = DeltaOptions::Mode::kExact;
  options.delta.base = DeltaOptions::Base::kChained;
  options.delta.max_restore_read_factor = 0;
  options.delta.full_every = full_every;
  auto engine = Engine::Open(root, options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::vector<OwnedTensor> state = {RandomTensor("m.w", DType::kFloat32, {30000}, 1),
                                    RandomTensor("n.b", DType::kFloat32, {50}, 2)};
  std::mt19937_64 rng(3);
  for (int step = 1; step <= 4; ++step) {
    for (auto& t : state) {
      for (int i = 0; i < 30; ++i) t.bytes[rng() % t.bytes.size()] ^= 0x11;
    }
    ASSERT_TRUE((*engine)->Save(step, Views(state)).ok());
  }
}

// Every tensor of `step` as `root` restores it, with its checksum.
std::map<std::string, uint64_t> Restored(const std::string& root, int64_t step) {
  ReaderOptions options;
  options.step = step;
  auto reader = Reader::Open(root, options);
  EXPECT_TRUE(reader.ok()) << root << " step " << step << ": " << reader.status();
  std::map<std::string, uint64_t> out;
  if (!reader.ok()) return out;
  for (const TensorInfo& t : (*reader)->tensors()) {
    auto tensor = (*reader)->Read(t.name);
    EXPECT_TRUE(tensor.ok()) << root << " step " << step << " " << t.name << ": " << tensor.status();
    if (tensor.ok()) out[t.name] = internal::Xxh3(tensor->data(), tensor->nbytes());
  }
  return out;
}

class TieringTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    template_ = new ScratchDir("ckpt-tier-template");
    WriteSteps(template_->Join("chained"), 2);  // 1 full, 2 delta, 3 full, 4 delta
    for (int64_t step = 1; step <= 4; ++step) {
      expected_[step] = Restored(template_->Join("chained"), step);
    }
  }
  static void TearDownTestSuite() {
    delete template_;
    template_ = nullptr;
  }
  void SetUp() override {
    auto& server = ckpt::testing::SharedMotoServer();
    server.ExportEnvironment();
    bucket_ = ckpt::testing::NewTestBucket();
    root_ = dir_.Join("root");
    std::filesystem::copy(template_->Join("chained"), root_, std::filesystem::copy_options::recursive);
  }
  std::shared_ptr<ObjectStore> Store(std::shared_ptr<HttpTransport> transport = nullptr) {
    ObjectStoreOptions options = ckpt::testing::SharedMotoServer().Options();
    options.transport = transport;
    options.max_attempts = 4;
    auto store = OpenObjectStore("s3://" + bucket_, options);
    EXPECT_TRUE(store.ok()) << store.status();
    return *store;
  }
  RetentionPolicy Policy(const std::string& prefix, std::shared_ptr<ObjectStore> store) {
    RetentionPolicy p;
    p.keep_last = 1;  // keeps 4 and its base 3; 1 and 2 move
    p.cold_dir = absl::StrCat("s3://", bucket_, "/", prefix);
    p.cold_store = std::move(store);
    p.upload_part_bytes = 32 << 10;  // multipart for the shards
    p.upload_streams = 1;            // a repeatable request order for the sweep
    p.lease_duration = absl::Seconds(30);
    return p;
  }

  static ScratchDir* template_;
  static std::map<int64_t, std::map<std::string, uint64_t>> expected_;
  ScratchDir dir_;
  std::string bucket_, root_;
};
ScratchDir* TieringTest::template_ = nullptr;
std::map<int64_t, std::map<std::string, uint64_t>> TieringTest::expected_;

TEST_F(TieringTest, MovesOldStepsToTheBucketWhereTheyRestoreBitIdentical) {
  auto store = Store();
  auto actions = RunRetention(root_, Policy("cold", store));
  ASSERT_TRUE(actions.ok()) << actions.status();
  for (const RetentionAction& a : *actions) EXPECT_TRUE(a.error.empty()) << a.name << ": " << a.error;
  EXPECT_EQ(*ListSteps(root_), (std::vector<int64_t>{3, 4}));
  const std::string url = absl::StrCat("s3://", bucket_, "/cold");
  EXPECT_EQ(*ListSteps(url), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(Restored(url, 1), expected_[1]);
  EXPECT_EQ(Restored(url, 2), expected_[2]);  // a delta, resolved across the bucket
  EXPECT_TRUE(store->ListMultipartUploads("")->empty());
  EXPECT_EQ(store->Head("cold/.ckpt-retain.lease").status().code(), absl::StatusCode::kNotFound);
  // A second run has nothing to do.
  auto again = RunRetention(root_, Policy("cold", store));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*ListSteps(root_), (std::vector<int64_t>{3, 4}));
}

TEST_F(TieringTest, DeltaWhoseBaseStaysHotIsCompactedIntoTheBucket) {
  ScratchDir d;
  const std::string root = d.Join("r");
  WriteSteps(root, 3);  // 1 full, 2 delta of 1, 3 delta of 2, 4 full
  const auto want3 = Restored(root, 3);
  auto store = Store();
  RetentionPolicy policy = Policy("cold", store);
  policy.keep_last = 1;
  policy.keep_every = 2;  // 2 and 4 stay; 3 leaves while its base 2 stays hot
  auto actions = RunRetention(root, policy);
  ASSERT_TRUE(actions.ok()) << actions.status();
  bool compact_moved = false;
  for (const RetentionAction& a : *actions) {
    EXPECT_TRUE(a.error.empty()) << a.name << ": " << a.error;
    if (a.step == 3) compact_moved = a.kind == RetentionAction::Kind::kCompactMove && a.done;
  }
  EXPECT_TRUE(compact_moved);
  auto marker = ReadCommitMarker(*store, "cold", 3);
  ASSERT_TRUE(marker.ok() && marker->has_value());
  EXPECT_FALSE((*marker)->delta);
  EXPECT_TRUE((*marker)->compacted);
  const std::string url = absl::StrCat("s3://", bucket_, "/cold");
  EXPECT_EQ(Restored(url, 3), want3);
  auto local = ListSteps(root);
  EXPECT_EQ(std::count(local->begin(), local->end(), 3), 0);
  // The local staging root of the compaction is gone.
  for (const auto& e : std::filesystem::directory_iterator(root)) {
    EXPECT_FALSE(absl::StartsWith(e.path().filename().string(), ".tmp-tier-")) << e.path();
  }
}

TEST_F(TieringTest, SecondJobOnThePrefixExitsWithAClearMessage) {
  auto store = Store();
  auto held = ObjectLease::Acquire(store, "cold", "another job", absl::Minutes(5));
  ASSERT_TRUE(held.ok()) << held.status();
  auto refused = RunRetention(root_, Policy("cold", store));
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "another job")) << refused.status();
  EXPECT_EQ(*ListSteps(root_), (std::vector<int64_t>{1, 2, 3, 4}));
  // Through the command line: exit code 4, one line on stderr.
  const std::string cold = absl::StrCat("s3://", bucket_, "/cold");
  std::vector<const char*> argv = {"ckpt-retain", "--root", root_.c_str(), "--keep-last", "1",
                                   "--cold-dir", cold.c_str()};
  std::ostringstream out, err;
  EXPECT_EQ(tools::RetainMain(static_cast<int>(argv.size()), argv.data(), out, err), 4);
  EXPECT_TRUE(absl::StrContains(err.str(), "is held by another job")) << err.str();
  // --lease-wait: waits that long, then the same exit naming the wait.
  std::vector<const char*> waiting = argv;
  for (const char* w : {"--lease-wait", "1s"}) waiting.push_back(w);
  out.str("");
  err.str("");
  EXPECT_EQ(tools::RetainMain(static_cast<int>(waiting.size()), waiting.data(), out, err), 4);
  EXPECT_TRUE(absl::StrContains(err.str(), "(waited 1s for it)")) << err.str();
  std::vector<const char*> negative = argv;
  for (const char* w : {"--lease-wait", "-1s"}) negative.push_back(w);
  EXPECT_EQ(tools::RetainMain(static_cast<int>(negative.size()), negative.data(), out, err), 2);
  EXPECT_EQ(*ListSteps(root_), (std::vector<int64_t>{1, 2, 3, 4}));
  // ... and proceeds once the holder is done within the wait.
  waiting.back() = "2m";
  std::thread release([&] {
    absl::SleepFor(absl::Seconds(2));
    held->reset();
  });
  out.str("");
  err.str("");
  EXPECT_EQ(tools::RetainMain(static_cast<int>(waiting.size()), waiting.data(), out, err), 0) << err.str();
  release.join();
  EXPECT_EQ(*ListSteps(root_), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(*ListSteps(cold), (std::vector<int64_t>{1, 2}));
}

TEST_F(TieringTest, UploadFlagsOfTheCommandLine) {
  const std::string cold = absl::StrCat("s3://", bucket_, "/flags");
  auto run = [&](std::vector<std::string> extra) {
    std::vector<std::string> words = {"ckpt-retain", "--root", root_, "--keep-last", "1",
                                      "--cold-dir", cold};
    words.insert(words.end(), extra.begin(), extra.end());
    std::vector<const char*> argv;
    for (const std::string& w : words) argv.push_back(w.c_str());
    std::ostringstream out, err;
    const int code = tools::RetainMain(static_cast<int>(argv.size()), argv.data(), out, err);
    return std::make_pair(code, err.str());
  };
  auto small = run({"--upload-part-size", "4096"});
  EXPECT_EQ(small.first, 2);
  EXPECT_TRUE(absl::StrContains(small.second, "--upload-part-size")) << small.second;
  EXPECT_EQ(run({"--upload-streams", "0"}).first, 2);
  auto archive = run({"--upload-storage-class", "DEEP_ARCHIVE"});
  EXPECT_EQ(archive.first, 2);
  EXPECT_TRUE(absl::StrContains(archive.second, "--upload-storage-class: storage class DEEP_ARCHIVE"))
      << archive.second;
  EXPECT_EQ(run({"--upload-storage-class", "standard-ia"}).first, 2);
  EXPECT_EQ(*ListSteps(root_), (std::vector<int64_t>{1, 2, 3, 4}));
  auto ok = run({"--upload-streams", "2", "--upload-part-size", "5242880", "--max-upload-rate",
                 "100000000", "--upload-read-back", "--upload-storage-class", "ONEZONE_IA"});
  EXPECT_EQ(ok.first, 0) << ok.second;
  EXPECT_EQ(*ListSteps(cold), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(Restored(cold, 2), expected_[2]);
  auto store = Store();
  auto listed = store->List(StepPrefix("flags", 2) + "/", "");
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_FALSE(listed->objects.empty());
  for (const ObjectInfo& o : listed->objects) EXPECT_EQ(store->Head(o.key)->storage_class, "ONEZONE_IA") << o.key;
}

// Multi-rank checkpoints (one unit, two ranks' parts) tier and restore per
// rank from the bucket exactly as saved; so do zstd-compressed full saves.
TEST_F(TieringTest, MultiRankChainsAndCompressedSavesRestoreFromTheBucket) {
  ScratchDir d;
  const std::string root = d.Join("ranks");
  EngineOptions options = testing::SmallChunks();
  options.delta.mode = DeltaOptions::Mode::kExact;
  options.delta.base = DeltaOptions::Base::kChained;
  options.delta.max_restore_read_factor = 0;
  options.delta.full_every = 3;  // full: 1, 4; deltas: 2, 3, 5, 6
  std::map<int64_t, std::vector<std::vector<OwnedTensor>>> saved;
  {
    testing::Ranks ranks(root, 2, options, absl::Seconds(20));
    std::vector<std::vector<OwnedTensor>> states = {testing::RankState(0, 11),
                                                    testing::RankState(1, 11)};
    for (int64_t step = 1; step <= 6; ++step) {
      for (int r = 0; r < 2; ++r) testing::Step(states[r], r, step);
      std::vector<absl::Status> outcome = ranks.Save({step, step}, states);
      for (int r = 0; r < 2; ++r) ASSERT_TRUE(outcome[r].ok()) << outcome[r];
      saved[step] = states;
    }
    ranks.CloseAll();
  }
  RetentionPolicy policy = Policy("ranks", Store());
  auto actions = RunRetention(root, policy);
  ASSERT_TRUE(actions.ok()) << actions.status();
  for (const RetentionAction& a : *actions) EXPECT_TRUE(a.error.empty()) << a.name << ": " << a.error;
  const std::string url = absl::StrCat("s3://", bucket_, "/ranks");
  auto cold = ListSteps(url);
  ASSERT_TRUE(cold.ok()) << cold.status();
  EXPECT_EQ(*cold, (std::vector<int64_t>{1, 2, 3}));
  for (int64_t step : *cold) {
    for (int r = 0; r < 2; ++r) testing::ExpectRankPart(url, step, r, 2, saved[step][r]);
  }

  const std::string zroot = d.Join("zstd");
  EngineOptions z = testing::SmallChunks();
  z.compression.codec = CompressionCodec::kPlanes;  // float-compressed (byte planes)
  z.compression.adaptive = false;
  std::vector<OwnedTensor> state = {RandomTensor("a", DType::kFloat32, {20000}, 5)};
  for (size_t i = 0; i < state[0].bytes.size(); i += 2) state[0].bytes[i] = 0;  // compressible
  {
    auto engine = Engine::Open(zroot, z);
    ASSERT_TRUE(engine.ok()) << engine.status();
    ASSERT_TRUE((*engine)->Save(1, Views(state)).ok());
    ASSERT_TRUE((*engine)->Save(2, Views(state)).ok());
  }
  const auto want = Restored(zroot, 1);
  ASSERT_TRUE(RunRetention(zroot, Policy("zstd", Store())).ok());
  EXPECT_EQ(Restored(absl::StrCat("s3://", bucket_, "/zstd"), 1), want);
}

// Retention on the bucket itself: the rules over its committed steps, chains
// whole, marker first, nothing put there by hand removed.
TEST_F(TieringTest, RetentionOnTheBucketKeepsChainsAndHandUploads) {
  auto store = Store();
  ASSERT_TRUE(RunRetention(root_, Policy("cold", store)).ok());  // bucket: 1 (full), 2 (delta of 1)
  const std::string url = absl::StrCat("s3://", bucket_, "/cold");
  RetentionPolicy on_bucket;
  on_bucket.keep_last = 1;
  on_bucket.cold_store = store;
  auto kept = RunRetention(url, on_bucket);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(*ListSteps(url), (std::vector<int64_t>{1, 2}));  // 2 needs its base

  ScratchDir d;
  const std::string full_root = d.Join("full");
  WriteSteps(full_root, 1);  // every step full
  const auto want3 = Restored(full_root, 3);
  ASSERT_TRUE(RunRetention(full_root, Policy("full", store)).ok());
  const std::string full_url = absl::StrCat("s3://", bucket_, "/full");
  ASSERT_EQ(*ListSteps(full_url), (std::vector<int64_t>{1, 2, 3}));
  const std::string hand = StepPrefix("full", 1) + "/NOTES.txt";
  ASSERT_TRUE(store->Put(hand, std::string("mine"), {}).ok());
  on_bucket.dry_run = true;
  ASSERT_TRUE(RunRetention(full_url, on_bucket).ok());
  EXPECT_EQ(*ListSteps(full_url), (std::vector<int64_t>{1, 2, 3}));
  on_bucket.dry_run = false;
  auto pruned = RunRetention(full_url, on_bucket);
  ASSERT_TRUE(pruned.ok()) << pruned.status();
  for (const RetentionAction& a : *pruned) EXPECT_TRUE(a.error.empty()) << a.name << ": " << a.error;
  EXPECT_EQ(*ListSteps(full_url), (std::vector<int64_t>{3}));
  EXPECT_EQ(Restored(full_url, 3), want3);
  EXPECT_EQ(*store->Get(hand), "mine");
  auto left = store->List(StepPrefix("full", 2) + "/", "");
  EXPECT_TRUE(left->objects.empty());
  EXPECT_EQ(store->Head("full/.ckpt-retain.lease").status().code(), absl::StatusCode::kNotFound);
}

// After a faulted run: no committed step lost (local, or marked in the
// bucket and restoring as saved), no marker whose objects differ from it;
// after a clean rerun: the intended end state, no multipart upload left.
void CheckInvariants(const std::string& root, const std::string& url, ObjectStore& store,
                     const std::string& prefix,
                     const std::map<int64_t, std::map<std::string, uint64_t>>& expected,
                     const std::string& what) {
  auto local = ListSteps(root);
  ASSERT_TRUE(local.ok()) << what;
  auto marked = ListCommittedSteps(store, prefix);
  ASSERT_TRUE(marked.ok()) << what << ": " << marked.status();
  for (int64_t step = 1; step <= 4; ++step) {
    const bool hot = std::count(local->begin(), local->end(), step) > 0;
    const bool cold = std::count(marked->begin(), marked->end(), step) > 0;
    EXPECT_TRUE(hot || cold) << what << ": step " << step << " lost";
    if (!cold) continue;
    auto marker = ReadCommitMarker(store, prefix, step);
    ASSERT_TRUE(marker.ok() && marker->has_value()) << what;
    for (const CommitMarker::File& f : (*marker)->files) {
      auto bytes = store.Get(absl::StrCat(StepPrefix(prefix, step), "/", f.name));
      ASSERT_TRUE(bytes.ok()) << what << ": " << bytes.status();
      EXPECT_EQ(bytes->size(), f.bytes) << what << ": step " << step << " " << f.name;
      EXPECT_EQ(internal::Xxh3(bytes->data(), bytes->size()), f.xxh3)
          << what << ": marker of step " << step << " over an object that differs: " << f.name;
    }
    EXPECT_EQ(Restored(url, step), expected.at(step)) << what << ": step " << step;
  }
}

TEST_F(TieringTest, FaultSweepOverEveryRequestOfATieringRun) {
  // Count the requests of a clean run.
  uint64_t total = 0;
  {
    auto transport = std::make_shared<FaultInjectionTransport>(CurlHttpTransport());
    ScratchDir d;
    std::filesystem::copy(template_->Join("chained"), d.Join("r"), std::filesystem::copy_options::recursive);
    ASSERT_TRUE(RunRetention(d.Join("r"), Policy("count", Store(transport))).ok());
    total = transport->requests();
    ASSERT_GT(total, 10u);
  }
  int runs = 0, faulted_failures = 0;
  const auto started = std::chrono::steady_clock::now();
  for (TransportFault fault : {TransportFault::kCrash, TransportFault::kLoseResponse,
                               TransportFault::kCorruptBody, TransportFault::kFail}) {
    // A failed send is retried like a lost response is, but sent nowhere:
    // every third request is enough for it (the suite stays under a minute).
    const uint64_t stride = fault == TransportFault::kFail ? 3 : 1;
    for (uint64_t n = 0; n < total; n += stride) {
      const std::string what = absl::StrCat(testing::TransportFaultName(fault), " at request ", n);
      const std::string prefix = absl::StrCat("sweep-", testing::TransportFaultName(fault), "-", n);
      const std::string url = absl::StrCat("s3://", bucket_, "/", prefix);
      ScratchDir d;
      const std::string root = d.Join("r");
      std::filesystem::copy(template_->Join("chained"), root, std::filesystem::copy_options::recursive);
      auto transport = std::make_shared<FaultInjectionTransport>(CurlHttpTransport());
      transport->Arm(n, fault);
      RetentionPolicy policy = Policy(prefix, Store(transport));
      auto faulted = RunRetention(root, policy);
      ++runs;
      bool failed = !faulted.ok();
      if (faulted.ok()) {
        for (const RetentionAction& a : *faulted) failed = failed || !a.error.empty();
      }
      faulted_failures += failed;
      auto clean = Store();
      CheckInvariants(root, url, *clean, prefix, expected_, what);
      if (fault == TransportFault::kCrash) {
        // The dead job's lease stays until it expires (30 s here); an
        // operator who knows the job is dead may delete it, as this does.
        ASSERT_TRUE(clean->Delete(prefix + "/.ckpt-retain.lease").ok());
      }
      policy.cold_store = clean;
      auto rerun = RunRetention(root, policy);
      ASSERT_TRUE(rerun.ok()) << what << ": rerun: " << rerun.status();
      for (const RetentionAction& a : *rerun) EXPECT_TRUE(a.error.empty()) << what << ": rerun: " << a.error;
      EXPECT_EQ(*ListSteps(root), (std::vector<int64_t>{3, 4})) << what;
      EXPECT_EQ(*ListCommittedSteps(*clean, prefix), (std::vector<int64_t>{1, 2})) << what;
      CheckInvariants(root, url, *clean, prefix, expected_, what + ", rerun");
      EXPECT_TRUE(clean->ListMultipartUploads(prefix + "/")->empty()) << what;
      if (HasFatalFailure()) return;
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::cout << "fault sweep: " << total << " requests per clean run, " << runs << " faulted runs ("
            << faulted_failures << " reported a failure), " << seconds << " s\n";
  EXPECT_GT(faulted_failures, 0);
}

}  // namespace
}  // namespace ckpt
