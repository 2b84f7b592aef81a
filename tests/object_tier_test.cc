// The object tier against moto: publishing under the commit protocol, and
// restoring straight from the bucket, bit-identical to the local restore.
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <future>
#include <iterator>
#include <mutex>
#include <random>
#include <string_view>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "ckpt/catalog.h"
#include "ckpt/engine.h"
#include "ckpt/file_system_wrapper.h"
#include "ckpt/object_store.h"
#include "ckpt/object_tier.h"
#include "ckpt/reader.h"
#include "gtest/gtest.h"
#include "distributed_ranks.h"
#include "moto_server.h"
#include "test_util.h"
#include "testing/fault_injection_file_system.h"
#include "xxhash.h"
#include "testing/fault_injection_transport.h"

namespace ckpt {
namespace {

using testing::OwnedTensor;
using testing::RandomTensor;
using testing::ScratchDir;
using testing::Views;

EngineOptions Chained(int full_every) {
  EngineOptions options = testing::SmallChunks();
  options.delta.mode = DeltaOptions::Mode::kExact;
  options.delta.base = DeltaOptions::Base::kChained;
  options.delta.max_restore_read_factor = 0;
  options.delta.full_every = full_every;
  return options;
}

class ObjectTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto& server = ckpt::testing::SharedMotoServer();
    bucket_ = ckpt::testing::NewTestBucket();
    url_ = absl::StrCat("s3://", bucket_, "/runs/a");
    auto store = OpenObjectStore(url_, server.Options());
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *store;
    server.ExportEnvironment();  // for roots opened by URL alone
    root_ = dir_.Join("root");
  }

  void LeaveAnInterruptedUpload(std::string* key, std::string* bytes);

  // Saves steps 1..n (a full save every `full_every`), tensors big enough to
  // make multipart uploads with 64 KiB parts.
  void Save(int n, int full_every) {
    auto engine = Engine::Open(root_, Chained(full_every));
    ASSERT_TRUE(engine.ok()) << engine.status();
    std::vector<OwnedTensor> state = {RandomTensor("m.w", DType::kFloat32, {100000}, 1),
                                      RandomTensor("m.b", DType::kFloat32, {77}, 2),
                                      RandomTensor("n.w", DType::kBFloat16, {300, 7}, 3)};
    std::mt19937_64 rng(7);
    for (int step = 1; step <= n; ++step) {
      for (auto& t : state) {
        for (int i = 0; i < 40; ++i) t.bytes[rng() % t.bytes.size()] ^= 0x21;
      }
      ASSERT_TRUE((*engine)->Save(step, Views(state)).ok());
    }
  }

  PublishOptions Small() {
    PublishOptions o;
    o.part_bytes = 64 << 10;
    o.streams = 4;
    return o;
  }

  void PublishAll() {
    auto steps = ListSteps(root_);
    ASSERT_TRUE(steps.ok()) << steps.status();
    for (int64_t step : *steps) {
      auto stats = PublishCheckpoint(root_, step, *store_, "runs/a", Small());
      ASSERT_TRUE(stats.ok()) << "step " << step << ": " << stats.status();
    }
  }

  // Every tensor of `step` read from the bucket equals the local read.
  void ExpectSameAsLocal(int64_t step) {
    ReaderOptions options;
    options.step = step;
    auto local = Reader::Open(root_, options);
    ASSERT_TRUE(local.ok()) << local.status();
    auto remote = Reader::Open(url_, options);
    ASSERT_TRUE(remote.ok()) << "step " << step << ": " << remote.status();
    ASSERT_EQ((*remote)->tensors().size(), (*local)->tensors().size());
    for (const TensorInfo& t : (*local)->tensors()) {
      auto a = (*local)->Read(t.name);
      auto b = (*remote)->Read(t.name);
      ASSERT_TRUE(a.ok() && b.ok()) << t.name << ": " << b.status();
      ASSERT_EQ(a->nbytes(), b->nbytes());
      EXPECT_TRUE(testing::SameBytes(a->data(), b->data(), a->nbytes())) << "step " << step << " " << t.name;
    }
    EXPECT_TRUE((*remote)->Verify().ok());
  }

  ScratchDir dir_;
  std::string root_, bucket_, url_;
  std::shared_ptr<ObjectStore> store_;
};

TEST_F(ObjectTierTest, FullAndDeltaChainRestoreFromBucketBitIdentical) {
  Save(7, 4);  // 1 full, 2-4 deltas, 5 full, 6-7 deltas
  PublishAll();
  EXPECT_EQ(*ListCommittedSteps(*store_, "runs/a"), (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(*ListSteps(url_), (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7}));
  for (int64_t step = 1; step <= 7; ++step) ExpectSameAsLocal(step);
  auto latest = Reader::Open(url_, ReaderOptions{});
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ((*latest)->step(), 7);
  EXPECT_TRUE(store_->ListMultipartUploads("")->empty());
}

// Region reads (the call a resharded load makes) from the bucket equal the
// local ones, for a full step and a delta (a single-process checkpoint, whose
// records are read whole and checked; sharded DTensor chunks from a bucket
// are not covered here).
TEST_F(ObjectTierTest, RegionReadsFromBucketEqualLocal) {
  Save(3, 10);
  PublishAll();
  for (int64_t step : {1, 3}) {
    ReaderOptions options;
    options.step = step;
    auto local = Reader::Open(root_, options);
    auto remote = Reader::Open(url_, options);
    ASSERT_TRUE(local.ok() && remote.ok()) << remote.status();
    std::vector<float> a(5000), b(5000);
    RegionTarget ta{"m.w", {70001}, {5000}, a.data(), a.size() * 4};
    RegionTarget tb{"m.w", {70001}, {5000}, b.data(), b.size() * 4};
    ASSERT_TRUE((*local)->ReadRegions({&ta, 1}).ok());
    absl::Status read = (*remote)->ReadRegions({&tb, 1});
    ASSERT_TRUE(read.ok()) << read;
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << "step " << step;
  }
}

TEST_F(ObjectTierTest, PublishIsIdempotentAndRefusesAnotherCheckpointUnderTheStep) {
  Save(1, 1);
  auto first = PublishCheckpoint(root_, 1, *store_, "runs/a", Small());
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(first->already_there);
  EXPECT_GT(first->files, 1u);
  auto again = PublishCheckpoint(root_, 1, *store_, "runs/a", Small());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->already_there);
  // Another root's step 1 is another checkpoint.
  ScratchDir other;
  auto engine = Engine::Open(other.path(), EngineOptions{});
  std::vector<OwnedTensor> state = {RandomTensor("x", DType::kFloat32, {10}, 9)};
  ASSERT_TRUE((*engine)->Save(1, Views(state)).ok());
  EXPECT_EQ(PublishCheckpoint(other.path(), 1, *store_, "runs/a", Small()).status().code(),
            absl::StatusCode::kAlreadyExists);
}

TEST_F(ObjectTierTest, DeltaWaitsForItsBasesMarker) {
  Save(2, 10);
  auto delta = PublishCheckpoint(root_, 2, *store_, "runs/a", Small());
  EXPECT_EQ(delta.status().code(), absl::StatusCode::kFailedPrecondition) << delta.status();
  EXPECT_TRUE(ListCommittedSteps(*store_, "runs/a")->empty());
}

TEST_F(ObjectTierTest, StepWithoutMarkerIsInvisible) {
  Save(2, 1);
  PublishAll();
  ASSERT_TRUE(store_->Delete(MarkerKey("runs/a", 2)).ok());
  EXPECT_EQ(*ListSteps(url_), (std::vector<int64_t>{1}));
  auto latest = Reader::Open(url_, ReaderOptions{});
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ((*latest)->step(), 1);
}

TEST_F(ObjectTierTest, CorruptedObjectIsDataLossNamingKeyAndTensor) {
  Save(1, 1);
  PublishAll();
  // Damage the shard holding m.w, in the bucket only.
  ReaderOptions options;
  auto local = Reader::Open(root_, options);
  ASSERT_TRUE(local.ok());
  const TensorInfo* w = (*local)->Find("m.w");
  ASSERT_NE(w, nullptr);
  const std::string key = absl::StrCat(StepPrefix("runs/a", 1), "/", w->shard);
  std::string bytes = *store_->Get(key);
  bytes[w->offset + 100] ^= 0x40;
  ASSERT_TRUE(store_->Put(key, bytes, {}).ok());
  auto remote = Reader::Open(url_, options);
  ASSERT_TRUE(remote.ok()) << remote.status();
  auto read = (*remote)->Read("m.w");
  ASSERT_EQ(read.status().code(), absl::StatusCode::kDataLoss) << read.status();
  EXPECT_TRUE(absl::StrContains(read.status().message(), "m.w")) << read.status();
  EXPECT_TRUE(absl::StrContains(read.status().message(), key)) << read.status();
  EXPECT_FALSE((*remote)->Verify().ok());
}

TEST_F(ObjectTierTest, ObjectRootsRefuseWritesSayingWhatToDo) {
  auto engine = Engine::Open(url_, EngineOptions{});
  ASSERT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(engine.status().message(), "ckpt-retain")) << engine.status();
  auto fs = FileSystemForRoot(url_);
  ASSERT_TRUE(fs.ok());
  OpenOptions write;
  write.write = true;
  write.create = true;
  auto file = (*fs)->Open(url_ + "/x", write);
  EXPECT_EQ(file.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_TRUE(absl::StrContains(file.status().message(), "read-only")) << file.status();
  EXPECT_EQ((*fs)->CreateDir(url_ + "/d").code(), absl::StatusCode::kUnimplemented);
}

TEST_F(ObjectTierTest, HandUploadsAreNeverOverwrittenNorReclaimed) {
  Save(1, 1);
  const std::string hand = StepPrefix("runs/a", 1) + "/MANIFEST.json";
  ASSERT_TRUE(store_->Put(hand, std::string("copied by hand"), {}).ok());
  auto published = PublishCheckpoint(root_, 1, *store_, "runs/a", Small());
  EXPECT_EQ(published.status().code(), absl::StatusCode::kAlreadyExists) << published.status();
  auto reclaimed = ReclaimObjectOrphans(*store_, "runs/a");
  ASSERT_TRUE(reclaimed.ok()) << reclaimed.status();
  EXPECT_EQ(reclaimed->objects_deleted, 0u);
  EXPECT_EQ(*store_->Get(hand), "copied by hand");
}

// A cold tier in a cheaper class: every object of the step (single PUTs and
// multipart uploads alike) is stored in it, the marker in the default class,
// and the step restores as any other.
TEST_F(ObjectTierTest, ObjectsGoInTheStorageClassAskedForAndTheMarkerInTheDefault) {
  Save(1, 1);
  PublishOptions options = Small();
  options.storage_class = "STANDARD_IA";
  ASSERT_TRUE(PublishCheckpoint(root_, 1, *store_, "runs/a", options).ok());
  auto listed = store_->List(StepPrefix("runs/a", 1) + "/", "");
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_GE(listed->objects.size(), 2u);
  bool multipart = false;
  for (const ObjectInfo& o : listed->objects) {
    auto head = store_->Head(o.key);
    ASSERT_TRUE(head.ok()) << head.status();
    multipart |= o.size > options.part_bytes;
    EXPECT_EQ(head->storage_class, "STANDARD_IA") << o.key;
  }
  EXPECT_TRUE(multipart) << "no object went up in parts: the test would not cover multipart uploads";
  auto marker = store_->Head(MarkerKey("runs/a", 1));
  ASSERT_TRUE(marker.ok()) << marker.status();
  EXPECT_TRUE(marker->storage_class.empty() || marker->storage_class == "STANDARD") << marker->storage_class;
  ExpectSameAsLocal(1);
}

TEST_F(ObjectTierTest, ArchiveClassesAndMalformedNamesAreRefusedBeforeAnyRequest) {
  EXPECT_TRUE(CheckStorageClass("").ok());
  EXPECT_TRUE(CheckStorageClass("GLACIER_IR").ok());
  EXPECT_TRUE(CheckStorageClass("INTELLIGENT_TIERING").ok());
  for (const char* bad : {"standard_ia", "STANDARD IA", "STANDARD\r\nx-amz-acl: public-read"}) {
    const absl::Status s = CheckStorageClass(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_TRUE(absl::StrContains(s.message(), "not a storage class name")) << s;
  }
  Save(1, 1);
  for (const char* archive : {"GLACIER", "DEEP_ARCHIVE"}) {
    PublishOptions options = Small();
    options.storage_class = archive;
    auto published = PublishCheckpoint(root_, 1, *store_, "runs/a", options);
    EXPECT_EQ(published.status().code(), absl::StatusCode::kInvalidArgument) << archive;
    EXPECT_TRUE(absl::StrContains(published.status().message(), "restore request")) << published.status();
  }
  EXPECT_TRUE(store_->List("runs/a/", "")->objects.empty());
}

TEST_F(ObjectTierTest, ReclaimRemovesDeadJobsUploadsAndUnmarkedObjects) {
  Save(2, 1);
  PublishAll();
  ASSERT_TRUE(store_->Delete(MarkerKey("runs/a", 2)).ok());  // as if the job died before it
  auto id = store_->CreateMultipartUpload(StepPrefix("runs/a", 3) + "/x.shard", {});
  ASSERT_TRUE(id.ok());
  // An upload of an unfinished step younger than the stale age is left for
  // a rerun to resume ... (moto dates every upload 2010-11-10, hence the age.)
  auto young = ReclaimObjectOrphans(*store_, "runs/a", absl::Hours(24 * 365 * 100));
  ASSERT_TRUE(young.ok()) << young.status();
  EXPECT_EQ(young->uploads_aborted, 0u);
  // ... a stale one goes (as does every unmarked object ckpt uploaded).
  auto reclaimed = ReclaimObjectOrphans(*store_, "runs/a", absl::ZeroDuration());
  ASSERT_TRUE(reclaimed.ok()) << reclaimed.status();
  EXPECT_EQ(reclaimed->uploads_aborted, 1u);
  EXPECT_EQ(young->objects_deleted + reclaimed->objects_deleted > 0, true);
  EXPECT_TRUE(store_->List(StepPrefix("runs/a", 2) + "/", "")->objects.empty());
  EXPECT_FALSE(store_->List(StepPrefix("runs/a", 1) + "/", "")->objects.empty());
  EXPECT_TRUE(store_->ListMultipartUploads("")->empty());
}

// Saves step 1 and leaves what a run killed mid-upload leaves for the shard
// holding "m.w": a multipart upload whose parts 1 and 2 (64 KiB each) hold
// the shard's bytes and whose part 3 differs from them. `key` is the shard's
// object, `bytes` the local file.
void ObjectTierTest::LeaveAnInterruptedUpload(std::string* key, std::string* bytes) {
  Save(1, 1);
  ReaderOptions options;
  auto local = Reader::Open(root_, options);
  ASSERT_TRUE(local.ok());
  const std::string shard = (*local)->Find("m.w")->shard;
  std::ifstream in(dir_.Join("root/" + StepDirName(1) + "/" + shard), std::ios::binary);
  bytes->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  const size_t part = 64 << 10;
  ASSERT_GT(bytes->size(), 3 * part);
  *key = StepPrefix("runs/a", 1) + "/" + shard;
  auto id = store_->CreateMultipartUpload(*key, {false, {{"ckpt-xxh3", "0"}}});
  ASSERT_TRUE(id.ok());
  const std::string_view all(*bytes);
  ASSERT_TRUE(store_->UploadPart(*key, *id, 1, all.substr(0, part)).ok());
  ASSERT_TRUE(store_->UploadPart(*key, *id, 2, all.substr(part, part)).ok());
  std::string wrong(all.substr(2 * part, part));
  wrong[10] ^= 1;
  ASSERT_TRUE(store_->UploadPart(*key, *id, 3, wrong).ok());
}

// A multipart upload an interrupted run left is resumed: parts the server
// holds with the local bytes' MD5 are not sent again; a part that differs is.
TEST_F(ObjectTierTest, InterruptedMultipartUploadResumesWithoutResendingHeldParts) {
  std::string key, bytes;
  ASSERT_NO_FATAL_FAILURE(LeaveAnInterruptedUpload(&key, &bytes));
  auto older = store_->CreateMultipartUpload(key, {});  // newer, in fact: the one resumed
  ASSERT_TRUE(older.ok());
  auto published = PublishCheckpoint(root_, 1, *store_, "runs/a", Small());
  ASSERT_TRUE(published.ok()) << published.status();
  // The newest upload (empty) was resumed and the other aborted, or the
  // other way round: either way at most the two good parts were kept.
  EXPECT_LE(published->parts_resumed, 2u);
  EXPECT_EQ(*store_->Get(key), bytes);
  EXPECT_TRUE(store_->ListMultipartUploads("")->empty());
  ExpectSameAsLocal(1);
}

TEST_F(ObjectTierTest, ResumedPartsAreCounted) {
  std::string key, bytes;
  ASSERT_NO_FATAL_FAILURE(LeaveAnInterruptedUpload(&key, &bytes));
  auto published = PublishCheckpoint(root_, 1, *store_, "runs/a", Small());
  ASSERT_TRUE(published.ok()) << published.status();
  EXPECT_EQ(published->parts_resumed, 2u);  // parts 1 and 2; 3 differed and went again
  EXPECT_EQ(*store_->Get(key), bytes);
  EXPECT_TRUE(store_->ListMultipartUploads("")->empty());
  ExpectSameAsLocal(1);
}

// The store's ETags (the MD5 of what it received) confirm each upload: a
// clean publish reads nothing back, `read_back` reads every object, and a
// body damaged on the way up -- its ETag is the MD5 of the damaged bytes --
// is read back, found different and sent again.
TEST_F(ObjectTierTest, EtagsConfirmUploadsAndADamagedBodyIsReadBackAndSentAgain) {
  Save(3, 1);  // three full steps, each with multipart shards (64 KiB parts)
  auto clean = PublishCheckpoint(root_, 1, *store_, "runs/a", Small());
  ASSERT_TRUE(clean.ok()) << clean.status();
  EXPECT_EQ(clean->objects_read_back, 0u);
  ExpectSameAsLocal(1);

  PublishOptions every = Small();
  every.read_back = true;
  auto checked = PublishCheckpoint(root_, 2, *store_, "runs/a", every);
  ASSERT_TRUE(checked.ok()) << checked.status();
  EXPECT_EQ(checked->objects_read_back, checked->files);
  EXPECT_GT(checked->requests, clean->requests);

  // Step 3: the first request that carries an object's bytes is damaged.
  // Requests before the uploads are made one at a time, so a clean run's
  // log names its index.
  uint64_t first_body = UINT64_MAX;
  {
    auto log_transport = std::make_shared<testing::FaultInjectionTransport>(CurlHttpTransport());
    ObjectStoreOptions options = testing::SharedMotoServer().Options();
    options.transport = log_transport;
    auto store = OpenObjectStore(url_, options);
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE(PublishCheckpoint(root_, 3, **store, "runs/probe", Small()).ok());
    const std::vector<std::string> log = log_transport->log();
    for (size_t i = 0; i < log.size() && first_body == UINT64_MAX; ++i) {
      if (absl::StartsWith(log[i], "PUT ") && absl::StrContains(log[i], "/step-") &&
          !absl::StrContains(log[i], ".commit")) {
        first_body = i;
      }
    }
  }
  ASSERT_NE(first_body, UINT64_MAX);
  auto transport = std::make_shared<testing::FaultInjectionTransport>(CurlHttpTransport());
  transport->Arm(first_body, testing::TransportFault::kCorruptBody);
  ObjectStoreOptions options = testing::SharedMotoServer().Options();
  options.transport = transport;
  auto faulty = OpenObjectStore(url_, options);
  ASSERT_TRUE(faulty.ok());
  auto damaged = PublishCheckpoint(root_, 3, **faulty, "runs/a", Small());
  ASSERT_TRUE(damaged.ok()) << damaged.status();
  EXPECT_TRUE(transport->fired());
  EXPECT_GE(damaged->objects_read_back, 1u);
  ExpectSameAsLocal(3);
}

// A multi-rank checkpoint published by its ranks (PublishOptions::part),
// then committed once (CommitPublishedParts): a rank's part leaves the other
// rank's uploads alone and writes no marker; a commit missing a rank's files
// writes none either, naming one; with every rank's, the step restores from
// the bucket as it does locally, rank by rank.
// Opens each file after a random pause of up to 15 ms: parallel upload
// streams then finish reading their parts in a shuffled order.
class ShuffledOpens : public FileSystemWrapper {
 public:
  using FileSystemWrapper::FileSystemWrapper;
  absl::StatusOr<std::unique_ptr<File>> Open(const std::string& path, const OpenOptions& options) override {
    int pause_us;
    {
      std::lock_guard<std::mutex> lock(mu_);
      pause_us = static_cast<int>(rng_() % 15000);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(pause_us));
    return FileSystemWrapper::Open(path, options);
  }

 private:
  std::mutex mu_;
  std::mt19937 rng_{11};
};

// Each file is read once, for upload, and hashed from the same buffers (a
// multipart file's parts in order, though read by parallel streams): the
// marker lists the XXH3 of each local file as hashed here. A read of the
// local files that fails, wherever it falls among the parts, ends the
// publish with that error, no marker, and no stream left waiting.
TEST_F(ObjectTierTest, FilesAreHashedAsTheyUploadAndAFailedReadLeavesNoMarker) {
  Save(1, 1);
  auto fs = std::make_shared<testing::FaultInjectionFileSystem>(PosixFileSystem());
  PublishOptions options = Small();
  options.fs = fs;
  fs->RecordCalls(true);
  ASSERT_TRUE(PublishCheckpoint(root_, 1, *store_, "runs/counting", options).ok());
  std::vector<uint64_t> reads;  // call numbers of the local reads
  const std::vector<std::string> calls = fs->recorded_calls();
  for (size_t i = 0; i < calls.size(); ++i) {
    if (absl::StartsWith(calls[i], "ReadAt ")) reads.push_back(i + 1);
  }
  ASSERT_GE(reads.size(), 8u) << "expected a multipart file's parts among the reads";
  fs->RecordCalls(false);
  for (uint64_t n : {reads[0], reads[1], reads[reads.size() / 2], reads[reads.size() - 2], reads.back()}) {
    // (The streams interleave their opens, reads and closes differently from
    // run to run: call n is a local read or one of its neighbours.)
    const uint64_t injected_before = fs->injected_count();
    fs->ResetCallCount();
    fs->FailAt(n, testing::Fault::kEio);
    auto publish = std::async(std::launch::async,
                              [&] { return PublishCheckpoint(root_, 1, *store_, "runs/a", options); });
    ASSERT_EQ(publish.wait_for(std::chrono::seconds(120)), std::future_status::ready)
        << "publish still running 120 s after a failed read at call " << n;
    auto stats = publish.get();
    EXPECT_FALSE(stats.ok()) << "read " << n << " failed, yet the publish succeeded";
    EXPECT_EQ(fs->injected_count(), injected_before + 1);
    auto marker = ReadCommitMarker(*store_, "runs/a", 1);
    ASSERT_TRUE(marker.ok()) << marker.status();
    EXPECT_FALSE(marker->has_value()) << "a marker after a failed read at call " << n;
    fs->ClearFaults();
  }
  options.fs = std::make_shared<ShuffledOpens>(PosixFileSystem());  // parts read out of order
  auto stats = PublishCheckpoint(root_, 1, *store_, "runs/a", options);
  ASSERT_TRUE(stats.ok()) << stats.status();
  auto marker = ReadCommitMarker(*store_, "runs/a", 1);
  ASSERT_TRUE(marker.ok() && marker->has_value());
  auto steps = ListCheckpoints(root_);
  ASSERT_TRUE(steps.ok() && steps->size() == 1u);
  bool multipart = false;
  for (const CommitMarker::File& f : (*marker)->files) {
    std::ifstream in((*steps)[0].dir + "/" + f.name, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(f.bytes, bytes.size()) << f.name;
    EXPECT_EQ(f.xxh3, XXH3_64bits(bytes.data(), bytes.size())) << f.name;
    multipart |= bytes.size() > options.part_bytes;
  }
  EXPECT_TRUE(multipart);
  ExpectSameAsLocal(1);
}

TEST_F(ObjectTierTest, RanksPublishTheirPartsAndOneCommitWritesTheMarker) {
  {
    testing::Ranks ranks(root_, 2, testing::SmallChunks(), absl::Seconds(30));
    std::vector<std::vector<OwnedTensor>> states = {testing::RankState(0, 5), testing::RankState(1, 5)};
    for (int r = 0; r < 2; ++r) {  // big enough for multipart shards
      states[r].push_back(RandomTensor(absl::StrCat("shard.", r, ".big"), DType::kFloat32, {60000}, 40 + r));
    }
    std::vector<absl::Status> saved = ranks.Save({1, 1}, states);
    ASSERT_TRUE(saved[0].ok() && saved[1].ok()) << saved[0] << " / " << saved[1];
    ranks.CloseAll();
  }
  const std::string keys = StepPrefix("runs/a", 1) + "/";
  // Rank 1 died mid-upload once: its multipart upload stays for it to resume.
  auto left = store_->CreateMultipartUpload(keys + "rank-00001.interrupted", {false, {{"ckpt-xxh3", "0"}}});
  ASSERT_TRUE(left.ok()) << left.status();
  PublishOptions part = Small();
  part.part = 0;
  auto zero = PublishCheckpoint(root_, 1, *store_, "runs/a", part);
  ASSERT_TRUE(zero.ok()) << zero.status();
  EXPECT_EQ(store_->ListMultipartUploads(keys)->size(), 1u);  // rank 1's, untouched
  ASSERT_TRUE(store_->AbortMultipartUpload(keys + "rank-00001.interrupted", *left).ok());
  for (const CommitMarker::File& f : zero->published) EXPECT_TRUE(absl::StartsWith(f.name, "rank-00000.")) << f.name;
  EXPECT_TRUE(ListCommittedSteps(*store_, "runs/a")->empty());
  // Without rank 1's part: no marker, naming a file of it.
  auto early = CommitPublishedParts(root_, 1, *store_, "runs/a", zero->published, Small());
  EXPECT_EQ(early.status().code(), absl::StatusCode::kFailedPrecondition) << early.status();
  EXPECT_TRUE(absl::StrContains(early.status().message(), "rank-00001.")) << early.status();
  EXPECT_TRUE(ListCommittedSteps(*store_, "runs/a")->empty());
  part.part = 1;
  auto one = PublishCheckpoint(root_, 1, *store_, "runs/a", part);
  ASSERT_TRUE(one.ok()) << one.status();
  std::vector<CommitMarker::File> all = zero->published;
  all.insert(all.end(), one->published.begin(), one->published.end());
  auto committed = CommitPublishedParts(root_, 1, *store_, "runs/a", all, Small());
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_EQ(*ListCommittedSteps(*store_, "runs/a"), (std::vector<int64_t>{1}));
  auto marker = ReadCommitMarker(*store_, "runs/a", 1);
  ASSERT_TRUE(marker.ok() && marker->has_value());
  EXPECT_EQ((*marker)->world_size, 2);
  EXPECT_EQ((*marker)->files.size(), all.size() + 1);  // and the global manifest
  // Again (a rank's retry after the marker): already there, its files listed.
  auto again = PublishCheckpoint(root_, 1, *store_, "runs/a", part);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->already_there);
  EXPECT_EQ(again->published.size(), one->published.size());
  for (int r = 0; r < 2; ++r) {
    ReaderOptions options;
    options.step = 1;
    options.rank = r;
    auto local = Reader::Open(root_, options);
    auto remote = Reader::Open(url_, options);
    ASSERT_TRUE(local.ok() && remote.ok()) << remote.status();
    for (const TensorInfo& t : (*local)->tensors()) {
      auto a = (*local)->Read(t.name);
      auto b = (*remote)->Read(t.name);
      ASSERT_TRUE(a.ok() && b.ok()) << t.name << ": " << b.status();
      EXPECT_TRUE(testing::SameBytes(a->data(), b->data(), a->nbytes())) << "rank " << r << " " << t.name;
    }
  }
}

// A lease held longer than its duration is renewed, so no other job takes
// it over while its holder lives; released, it is free at once.
TEST_F(ObjectTierTest, AHeldLeaseIsRenewedPastItsDuration) {
  auto held = ObjectLease::Acquire(store_, "runs/a", "long job", absl::Milliseconds(1500));
  ASSERT_TRUE(held.ok()) << held.status();
  absl::SleepFor(absl::Milliseconds(2600));  // past its first expiry
  auto other = ObjectLease::Acquire(store_, "runs/a", "job two", absl::Minutes(1));
  EXPECT_EQ(other.status().code(), absl::StatusCode::kUnavailable) << other.status();
  EXPECT_GE((*held)->renewals(), 2);
  held->reset();
  auto after = ObjectLease::Acquire(store_, "runs/a", "job three", absl::Minutes(1));
  EXPECT_TRUE(after.ok()) << after.status();
}

TEST_F(ObjectTierTest, LeaseAdmitsOneJobAndIsTakenOverWhenExpired) {
  auto first = ObjectLease::Acquire(store_, "runs/a", "job one", absl::Minutes(10));
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = ObjectLease::Acquire(store_, "runs/a", "job two", absl::Minutes(10));
  ASSERT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(second.status().message(), "job one")) << second.status();
  first->reset();
  auto third = ObjectLease::Acquire(store_, "runs/a", "job three", absl::Seconds(-1));
  ASSERT_TRUE(third.ok()) << third.status();
  auto fourth = ObjectLease::Acquire(store_, "runs/a", "job four", absl::Minutes(1));
  ASSERT_TRUE(fourth.ok()) << "an expired lease is taken over: " << fourth.status();
}

// An older store that ignores `If-None-Match: *` (here: the header dropped
// on the way to moto) would let a second job take a held lease: Acquire
// finds out by creating the lease twice, releases it and refuses, saying
// why and what to do; CKPT_S3_UNCONDITIONAL_LEASE=1 makes it a warning.
class DropsConditions final : public HttpTransport {
 public:
  absl::StatusOr<HttpResponse> Send(const HttpRequest& r) override {
    HttpRequest copy = r;
    std::erase_if(copy.headers, [](const auto& h) { return h.first == "if-none-match"; });
    return base_->Send(copy);
  }

 private:
  std::shared_ptr<HttpTransport> base_ = CurlHttpTransport();
};

TEST_F(ObjectTierTest, AStoreThatIgnoresConditionalWritesIsRefusedTheLease) {
  ObjectStoreOptions options = testing::SharedMotoServer().Options();
  options.transport = std::make_shared<DropsConditions>();
  auto old_store = OpenObjectStore(url_, options);
  ASSERT_TRUE(old_store.ok()) << old_store.status();
  unsetenv("CKPT_S3_UNCONDITIONAL_LEASE");
  auto refused = ObjectLease::Acquire(*old_store, "runs/a", "job one", absl::Minutes(10));
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "ignored `If-None-Match: *`")) << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "CKPT_S3_UNCONDITIONAL_LEASE=1")) << refused.status();
  EXPECT_EQ(store_->Head("runs/a/.ckpt-retain.lease").status().code(), absl::StatusCode::kNotFound)
      << "the lease taken on the way is released";

  setenv("CKPT_S3_UNCONDITIONAL_LEASE", "1", 1);
  auto allowed = ObjectLease::Acquire(*old_store, "runs/a", "job one", absl::Minutes(10));
  unsetenv("CKPT_S3_UNCONDITIONAL_LEASE");
  ASSERT_TRUE(allowed.ok()) << allowed.status();
  EXPECT_TRUE(store_->Head("runs/a/.ckpt-retain.lease").ok());
  allowed->reset();
  // A store that honours the condition passes the check (one request more).
  auto held = ObjectLease::Acquire(store_, "runs/a", "job two", absl::Minutes(10));
  ASSERT_TRUE(held.ok()) << held.status();
}

// Opt-in: against a real bucket (AWS, MinIO, Ceph, R2, GCS XML) when
// CKPT_TEST_S3_URL=s3://bucket/prefix is set, with credentials and endpoint
// from the usual AWS_* variables. Publishes two steps under a fresh
// sub-prefix, restores them, then deletes what it wrote.
TEST(RealBucketSmokeTest, PublishRestoreAndCleanUp) {
  const char* base = getenv("CKPT_TEST_S3_URL");
  if (base == nullptr || *base == '\0') {
    GTEST_SKIP() << "opt-in: set CKPT_TEST_S3_URL=s3://bucket/prefix to run against a real bucket";
  }
  auto url = ParseObjectUrl(base);
  ASSERT_TRUE(url.ok()) << url.status();
  auto store = OpenObjectStore(base, {});
  ASSERT_TRUE(store.ok()) << store.status();
  const std::string prefix = absl::StrCat(url->prefix.empty() ? "" : url->prefix + "/", "ckpt-smoke-",
                                          getpid(), "-", time(nullptr));
  const std::string root_url = absl::StrCat("s3://", url->bucket, "/", prefix);
  ScratchDir dir;
  const std::string root = dir.Join("root");
  std::vector<OwnedTensor> state = {RandomTensor("m.w", DType::kFloat32, {1 << 20}, 1)};
  {
    auto engine = Engine::Open(root, Chained(10));
    ASSERT_TRUE(engine.ok());
    ASSERT_TRUE((*engine)->Save(1, Views(state)).ok());
    state[0].bytes[7] ^= 1;
    ASSERT_TRUE((*engine)->Save(2, Views(state)).ok());
  }
  PublishOptions options;
  options.part_bytes = 5 << 20;  // S3's smallest part: the 4 MiB shard goes whole, ...
  for (int64_t step : {1, 2}) {
    auto published = PublishCheckpoint(root, step, **store, prefix, options);
    EXPECT_TRUE(published.ok()) << published.status();
  }
  ReaderOptions at2;
  at2.step = 2;
  auto remote = Reader::Open(root_url, at2);
  ASSERT_TRUE(remote.ok()) << remote.status();
  auto w = (*remote)->Read("m.w");
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_TRUE(testing::SameBytes(w->data(), state[0].bytes.data(), state[0].bytes.size()));
  auto all = (*store)->List(prefix + "/", "");
  ASSERT_TRUE(all.ok());
  for (const ObjectInfo& o : all->objects) EXPECT_TRUE((*store)->Delete(o.key).ok()) << o.key;
}

TEST(CommitMarkerTest, RoundTripsAndRefusesDamage) {
  CommitMarker m;
  m.step = 12;
  m.delta = true;
  m.base_step = 10;
  m.manifest_xxh3 = 0x1234;
  m.files = {{"MANIFEST.json", 100, 7}, {"m.0.shard", 1 << 20, 9}};
  const std::string text = SerializeCommitMarker(m);
  auto back = ParseCommitMarker(text, "t");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->files.size(), 2u);
  EXPECT_EQ(back->base_step, 10);
  std::string flipped = text;
  flipped[20] ^= 1;
  EXPECT_EQ(ParseCommitMarker(flipped, "t").status().code(), absl::StatusCode::kDataLoss);
  m.files[0].name = "../escape";
  EXPECT_EQ(ParseCommitMarker(SerializeCommitMarker(m), "t").status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(ParseCommitMarker("garbage", "t").status().code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace ckpt
