// The eager copy spread over threads (staging/parallel_copier.h), hashing on
// the persister (engine/record_hasher.h), and whole saves through both.
#include <cstring>
#include <numeric>
#include <random>

#include "ckpt/engine.h"
#include "ckpt/reader.h"
#include "engine/record_hasher.h"
#include "staging/parallel_copier.h"
#include "util/hash.h"

#include "gtest/gtest.h"
#include "test_util.h"

namespace ckpt {
namespace {

using internal::CopyPiece;
using internal::ParallelCopier;
using internal::PlannedRecord;
using internal::PlannedShard;
using internal::RecordHasher;
using internal::StagedChunk;
using internal::Xxh3;
using testing::ExpectCheckpointEquals;
using testing::OwnedTensor;
using testing::RandomTensor;
using testing::ScratchDir;
using testing::Views;
using testing::WaitOrDie;

TEST(ParallelCopierTest, CopiesEveryPieceWithAnyThreadCountOverManyBatches) {
  std::mt19937_64 rng(7);
  std::vector<uint8_t> src(3 << 20);
  testing::FillRandom(src, 11);
  for (int threads : {1, 2, 3, 8}) {
    ParallelCopier copier(threads);
    EXPECT_EQ(copier.threads(), threads);
    for (int batch = 0; batch < 50; ++batch) {
      std::vector<uint8_t> dst(src.size(), 0);
      std::vector<CopyPiece> pieces;
      size_t offset = 0;
      while (offset < src.size()) {
        const size_t n = std::min<size_t>(src.size() - offset, 1 + rng() % (256 << 10));
        pieces.push_back(CopyPiece{reinterpret_cast<char*>(dst.data()) + offset,
                                   reinterpret_cast<const char*>(src.data()) + offset, n});
        offset += n;
      }
      std::shuffle(pieces.begin(), pieces.end(), rng);
      pieces.resize(pieces.size() - batch % 2);  // some batches leave a piece out
      copier.Run(pieces);
      std::vector<uint8_t> want(src.size(), 0);
      for (const CopyPiece& p : pieces) {
        const size_t at = p.dst - reinterpret_cast<char*>(dst.data());
        std::memcpy(want.data() + at, src.data() + at, p.bytes);
      }
      ASSERT_EQ(dst, want) << threads << " threads, batch " << batch;
    }
    copier.Run({});  // nothing to copy: returns at once
  }
}

TEST(ParallelCopierTest, DefaultThreadsIsBetweenOneAndFour) {
  EXPECT_GE(ParallelCopier::DefaultThreads(), 1);
  EXPECT_LE(ParallelCopier::DefaultThreads(), 4);
}

// A shard of records with padding between them, empty records among them,
// cut into chunks of `chunk` bytes.
class RecordHasherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PlannedShard a;
    a.file = "a.0.shard";
    a.records = {{0, 0, 0}, {1, 0, 5000}, {2, 8192, 0}, {3, 8192, 1}, {4, 12288, 40000},
                 {5, 53248, 4096}};
    a.padded_bytes = 57344;
    a.file_bytes = 57344;
    PlannedShard empty;  // only an empty record: no bytes, no chunks
    empty.file = "b.0.shard";
    empty.records = {{6, 0, 0}};
    PlannedShard c;
    c.file = "c.0.shard";
    c.records = {{7, 0, 100}, {8, 4096, 0}};
    c.padded_bytes = 4096;
    c.file_bytes = 100;
    plan_ = {a, empty, c};
    bytes_.resize(plan_.size());
    for (size_t s = 0; s < plan_.size(); ++s) {
      bytes_[s].resize(plan_[s].padded_bytes);
      testing::FillRandom(bytes_[s], 100 + s);
    }
  }
  std::vector<StagedChunk> Chunks(size_t shard, size_t chunk) const {
    std::vector<StagedChunk> out;
    for (uint64_t at = 0; at < plan_[shard].padded_bytes; at += chunk) {
      out.push_back(StagedChunk{shard, at, 0, std::min<size_t>(chunk, plan_[shard].padded_bytes - at)});
    }
    return out;
  }
  const char* Data(const StagedChunk& c) const {
    return reinterpret_cast<const char*>(bytes_[c.shard].data()) + c.file_offset;
  }
  uint64_t Want(size_t shard, const PlannedRecord& r) const {
    return Xxh3(bytes_[shard].data() + r.offset, r.bytes);
  }
  std::vector<PlannedShard> plan_;
  std::vector<std::vector<uint8_t>> bytes_;
};

// Block hashes (a sharded chunk's) come out of the same pass: one per
// `block` bytes of the record, the last one short, whatever the chunking.
TEST_F(RecordHasherTest, HashesEachBlockOfTheRecordsThatAskForThem) {
  for (size_t chunk : {size_t{4096}, size_t{12288}, size_t{65536}}) {
    std::vector<uint64_t> hashes(9, 0);
    std::vector<uint64_t> block_bytes(9, 0);
    block_bytes[4] = 8192;  // 40000 bytes: four whole blocks and 7232
    block_bytes[5] = 4096;  // exactly one block
    std::vector<std::vector<uint64_t>> blocks(9);
    RecordHasher hasher(plan_, hashes, block_bytes, &blocks);
    for (size_t s = 0; s < plan_.size(); ++s) {
      for (const StagedChunk& c : Chunks(s, chunk)) ASSERT_TRUE(hasher.Consume(c, Data(c)).ok());
    }
    ASSERT_TRUE(hasher.Finish().ok());
    for (size_t t : {4, 5}) {
      const PlannedRecord& r = plan_[0].records[t];
      std::vector<uint64_t> want;
      for (uint64_t at = 0; at < r.bytes; at += block_bytes[t]) {
        want.push_back(Xxh3(bytes_[0].data() + r.offset + at, std::min<uint64_t>(block_bytes[t], r.bytes - at)));
      }
      EXPECT_EQ(blocks[t], want) << "tensor " << t << ", chunk " << chunk;
      EXPECT_EQ(hashes[t], Want(0, r));
    }
    EXPECT_TRUE(blocks[1].empty());
  }
}

TEST_F(RecordHasherTest, HashesEveryRecordWhateverTheChunkSize) {
  for (size_t chunk : {size_t{4096}, size_t{8192}, size_t{65536}, size_t{1 << 20}}) {
    std::vector<uint64_t> hashes(9, 0);
    RecordHasher hasher(plan_, hashes);
    // Shards interleave: chunk i of every shard, then chunk i + 1.
    std::vector<std::vector<StagedChunk>> chunks = {Chunks(0, chunk), Chunks(1, chunk), Chunks(2, chunk)};
    for (size_t i = 0; i < 16; ++i) {
      for (const auto& shard : chunks) {
        if (i < shard.size()) ASSERT_TRUE(hasher.Consume(shard[i], Data(shard[i])).ok());
      }
    }
    ASSERT_TRUE(hasher.Finish().ok()) << chunk;
    for (size_t s = 0; s < plan_.size(); ++s) {
      for (const PlannedRecord& r : plan_[s].records) {
        EXPECT_EQ(hashes[r.tensor], Want(s, r)) << "tensor " << r.tensor << ", chunk " << chunk;
      }
    }
  }
}

TEST_F(RecordHasherTest, AChunkOutOfOrderIsAnInternalError) {
  std::vector<uint64_t> hashes(9, 0);
  RecordHasher hasher(plan_, hashes);
  std::vector<StagedChunk> chunks = Chunks(0, 4096);
  ASSERT_TRUE(hasher.Consume(chunks[0], Data(chunks[0])).ok());
  absl::Status skipped = hasher.Consume(chunks[2], Data(chunks[2]));
  EXPECT_EQ(skipped.code(), absl::StatusCode::kInternal);
  EXPECT_NE(skipped.message().find("a.0.shard"), std::string::npos) << skipped;
}

TEST_F(RecordHasherTest, AMissingChunkFailsFinishNamingTheTensor) {
  std::vector<uint64_t> hashes(9, 0);
  RecordHasher hasher(plan_, hashes);
  std::vector<StagedChunk> chunks = Chunks(0, 4096);
  chunks.pop_back();  // the last chunk, with record 5, never arrives
  for (const StagedChunk& c : chunks) ASSERT_TRUE(hasher.Consume(c, Data(c)).ok());
  for (const StagedChunk& c : Chunks(2, 4096)) ASSERT_TRUE(hasher.Consume(c, Data(c)).ok());
  absl::Status finished = hasher.Finish();
  EXPECT_EQ(finished.code(), absl::StatusCode::kInternal);
  EXPECT_NE(finished.message().find("tensor 5"), std::string::npos) << finished;
}

// Whole saves: every byte and stored checksum, for eager saves copied by one
// thread or several, through a pool far smaller than the save (the caller
// streams through it, so batches must run before it waits for chunks), and
// for lazy saves.
struct CopyCase {
  const char* name;
  int staging_threads;
  bool lazy;
  size_t staging_bytes;
};

class StagedSaveTest : public ::testing::TestWithParam<CopyCase> {};

TEST_P(StagedSaveTest, EveryByteAndChecksumSurvives) {
  ScratchDir dir;
  EngineOptions options = testing::SmallChunks();
  options.staging_threads = GetParam().staging_threads;
  options.lazy_staging = GetParam().lazy;
  options.staging_bytes = GetParam().staging_bytes;
  options.shard_max_bytes = 8 << 20;
  std::vector<OwnedTensor> tensors;
  tensors.push_back(RandomTensor("embed.weight", DType::kFloat32, {3000, 4096}, 1));  // 48 MB: > one batch
  tensors.push_back(RandomTensor("embed.empty", DType::kFloat32, {0}, 2));
  for (int i = 0; i < 40; ++i) {
    const std::string block = "blocks." + std::to_string(i);
    tensors.push_back(RandomTensor(block + ".w", DType::kBFloat16, {257, 129}, 10 + i));
    tensors.push_back(RandomTensor(block + ".b", DType::kFloat32, {7}, 100 + i));
    tensors.push_back(RandomTensor(block + ".num_batches_tracked", DType::kInt64, {}, 200 + i));
  }
  tensors.push_back(RandomTensor("head.zero", DType::kUInt8, {0, 3}, 3));
  auto engine = Engine::Open(dir.path(), options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  for (int64_t step = 1; step <= 3; ++step) {
    tensors[0].bytes[step] ^= 0x5a;  // the state changes between saves
    auto handle = (*engine)->SaveAsync(step, Views(tensors));
    ASSERT_TRUE(handle.ok()) << handle.status();
    ASSERT_TRUE(WaitOrDie(**handle, absl::Seconds(120), "save").ok());
  }
  ASSERT_TRUE((*engine)->Close().ok());
  ExpectCheckpointEquals(dir.path(), 3, tensors);
}

INSTANTIATE_TEST_SUITE_P(
    Copies, StagedSaveTest,
    ::testing::Values(CopyCase{"OneThread", 1, false, 0}, CopyCase{"TwoThreads", 2, false, 0},
                      CopyCase{"FourThreads", 4, false, 0}, CopyCase{"Default", 0, false, 0},
                      CopyCase{"FourThreadsSmallPool", 4, false, 1 << 20},
                      CopyCase{"OneThreadSmallPool", 1, false, 1 << 20},
                      CopyCase{"Lazy", 0, true, 0}, CopyCase{"LazySmallPool", 0, true, 1 << 20}),
    [](const ::testing::TestParamInfo<CopyCase>& info) { return info.param.name; });

TEST(StagingThreadsTest, OutOfRangeIsRejectedAtOpen) {
  ScratchDir dir;
  for (int bad : {-1, 65}) {
    EngineOptions options;
    options.staging_threads = bad;
    auto engine = Engine::Open(dir.path(), options);
    ASSERT_FALSE(engine.ok());
    EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(engine.status().message().find("staging_threads"), std::string::npos);
  }
}

}  // namespace
}  // namespace ckpt
