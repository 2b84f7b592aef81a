// The bulk read path (`ReadRawRecords`): transfers in flight while workers
// copy out of bounce chunks and hash what landed, in place where the file's
// O_DIRECT alignment allows. Bytes must come back exact into memory of every
// alignment, and a damaged piece anywhere in a record -- first, middle, last,
// landing before or after its neighbours -- must fail the read with
// kDataLoss naming the record, on every backend.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "ckpt/engine.h"
#include "ckpt/reader.h"
#include "gtest/gtest.h"
#include "io/posix_file.h"
#include "read/fault_ahead.h"
#include "read/read_chunks.h"
#include "test_util.h"

namespace ckpt {
namespace {

using testing::OwnedTensor;
using testing::RandomTensor;
using testing::ScratchDir;
using testing::Views;

struct Backend {
  const char* name;
  IoBackend backend;
  DirectIoMode direct;
};

// A small GPT-shaped state: a 20 MiB embedding (read in large in-place
// transfers), 1-3 MiB layer weights (many chunks each), biases and norms of
// a few KiB with odd tails, and an empty tensor.
std::vector<OwnedTensor> ModelState() {
  std::vector<OwnedTensor> state;
  uint64_t seed = 11;
  state.push_back(RandomTensor("tok_embeddings.weight", DType::kBFloat16, {5120, 2048}, seed++));
  for (int layer = 0; layer < 2; ++layer) {
    const std::string p = absl::StrCat("layers.", layer, ".");
    state.push_back(RandomTensor(p + "attention.wqkv.weight", DType::kFloat32, {768, 1024}, seed++));
    state.push_back(RandomTensor(p + "attention.wo.weight", DType::kFloat32, {256, 1025}, seed++));
    state.push_back(RandomTensor(p + "feed_forward.w1.weight", DType::kBFloat16, {1031, 512}, seed++));
    state.push_back(RandomTensor(p + "attention_norm.weight", DType::kFloat32, {1027}, seed++));
    state.push_back(RandomTensor(p + "feed_forward.w1.bias", DType::kFloat32, {3}, seed++));
  }
  state.push_back(RandomTensor("norm.weight", DType::kFloat32, {0}, seed++));
  return state;
}

class ReadPipelineTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    root_ = scratch_.Join("root");
    state_ = ModelState();
    EngineOptions options;
    options.io = Io();
    auto engine = Engine::Open(root_, options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    auto stats = (*engine)->Save(1, Views(state_));
    ASSERT_TRUE(stats.ok()) << stats.status();
  }

  IoOptions Io() const {
    IoOptions io;
    io.backend = GetParam().backend;
    io.direct = GetParam().direct;
    io.chunk_bytes = 256 << 10;  // many pieces per record
    return io;
  }

  std::unique_ptr<Reader> Open() {
    ReaderOptions options;
    options.io = Io();
    auto reader = Reader::Open(root_, options);
    EXPECT_TRUE(reader.ok()) << reader.status();
    return reader.ok() ? std::move(*reader) : nullptr;
  }

  // Reads every tensor at once into one buffer, each at `skew` bytes past a
  // 4 KiB boundary, and returns the status; `out` holds the bytes.
  absl::Status ReadAllSkewed(Reader& reader, size_t skew, std::vector<std::unique_ptr<char[]>>& out) {
    std::vector<ReadTarget> targets;
    for (const OwnedTensor& t : state_) {
      const size_t room = t.bytes.size() + kDirectIoAlignment + skew;
      out.emplace_back(new char[room]);
      char* base = out.back().get();
      char* aligned = reinterpret_cast<char*>(AlignUp(reinterpret_cast<uintptr_t>(base)));
      targets.push_back(ReadTarget{t.name, aligned + skew, t.bytes.size()});
    }
    return reader.ReadInto(targets);
  }

  const OwnedTensor& Tensor(const std::string& name) const {
    for (const OwnedTensor& t : state_) {
      if (t.name == name) return t;
    }
    ADD_FAILURE() << "no tensor " << name;
    return state_.front();
  }

  void FlipByteOf(const TensorInfo& t, uint64_t at) {
    const std::string shard = absl::StrCat(dir_, "/", t.shard);
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good()) << shard;
    f.seekg(static_cast<std::streamoff>(t.offset + at));
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x41);
    f.seekp(static_cast<std::streamoff>(t.offset + at));
    f.write(&c, 1);
    ASSERT_TRUE(f.good());
  }

  ScratchDir scratch_{"ckpt-read-pipeline"};
  std::string root_;
  std::string dir_;
  std::vector<OwnedTensor> state_;
};

TEST_P(ReadPipelineTest, EveryAlignmentOfCallerMemoryReadsBitExact) {
  auto reader = Open();
  ASSERT_NE(reader, nullptr);
  // 0: in place everywhere; 64: torch's alignment (in place where the file
  // system's O_DIRECT memory alignment allows, else bounced); 512; 1.
  for (size_t skew : {size_t{0}, size_t{64}, size_t{512}, size_t{1}}) {
    SCOPED_TRACE(absl::StrCat("skew ", skew));
    std::vector<std::unique_ptr<char[]>> out;
    ASSERT_TRUE(ReadAllSkewed(*reader, skew, out).ok());
    for (size_t i = 0; i < state_.size(); ++i) {
      const char* got = reinterpret_cast<char*>(AlignUp(reinterpret_cast<uintptr_t>(out[i].get()))) + skew;
      EXPECT_TRUE(testing::SameBytes(got, state_[i].bytes.data(), state_[i].bytes.size())) << state_[i].name;
    }
  }
  auto all = reader->ReadAll();
  ASSERT_TRUE(all.ok()) << all.status();
  for (size_t i = 0; i < state_.size(); ++i) {
    EXPECT_TRUE(testing::SameBytes((*all)[i].data(), state_[i].bytes.data(), state_[i].bytes.size()))
        << state_[i].name;
  }
}

TEST_P(ReadPipelineTest, ADamagedPieceAnywhereInARecordIsDataLossNamingIt) {
  const std::string big = "tok_embeddings.weight";
  const std::string layer = "layers.1.attention.wo.weight";
  TensorInfo big_info, layer_info;
  {
    auto reader = Open();
    ASSERT_NE(reader, nullptr);
    dir_ = reader->dir();
    big_info = *reader->Find(big);
    layer_info = *reader->Find(layer);
  }
  // First byte, inside a middle 4 MiB transfer, the record's final partial
  // block; and a layer weight's last byte (its bounced tail).
  struct Damage {
    const TensorInfo* info;
    uint64_t at;
  };
  for (Damage d : {Damage{&big_info, 0}, Damage{&big_info, big_info.raw_bytes / 2 + 12345},
                   Damage{&big_info, big_info.raw_bytes - 1}, Damage{&layer_info, layer_info.raw_bytes - 1},
                   Damage{&layer_info, 300 << 10}}) {
    SCOPED_TRACE(absl::StrCat(d.info->name, " byte ", d.at));
    FlipByteOf(*d.info, d.at);
    auto reader = Open();
    ASSERT_NE(reader, nullptr);
    for (size_t skew : {size_t{0}, size_t{64}, size_t{1}}) {
      SCOPED_TRACE(absl::StrCat("skew ", skew));
      std::vector<std::unique_ptr<char[]>> out;
      const absl::Status status = ReadAllSkewed(*reader, skew, out);
      EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
      EXPECT_TRUE(absl::StrContains(status.message(), d.info->name)) << status;
    }
    EXPECT_EQ(reader->ReadAll().status().code(), absl::StatusCode::kDataLoss);
    // The undamaged tensor still reads, after failed reads on the same reader.
    const std::string other = d.info->name == big ? layer : big;
    auto good = reader->Read(other);
    ASSERT_TRUE(good.ok()) << good.status();
    EXPECT_TRUE(testing::SameBytes(good->data(), Tensor(other).bytes.data(), good->nbytes()));
    FlipByteOf(*d.info, d.at);  // repaired: the next damage is the only one
    auto repaired = Open();
    ASSERT_NE(repaired, nullptr);
    EXPECT_TRUE(repaired->Verify().ok());
  }
}

INSTANTIATE_TEST_SUITE_P(
    Backends, ReadPipelineTest,
    ::testing::Values(Backend{"uring_direct", IoBackend::kAuto, DirectIoMode::kAuto},
                      Backend{"threads_direct", IoBackend::kThreads, DirectIoMode::kAuto},
                      Backend{"threads_buffered", IoBackend::kThreads, DirectIoMode::kOff}),
    [](const ::testing::TestParamInfo<Backend>& info) { return std::string(info.param.name); });

TEST(DirectMemoryAlignmentTest, APosixFileReportsWhatStatxSays) {
  ScratchDir scratch("ckpt-dio-align");
  const std::string path = scratch.Join("f");
  { std::ofstream(path) << std::string(8192, 'x'); }
  std::shared_ptr<FileSystem> fs = PosixFileSystem();
  OpenOptions options;
  options.direct = true;
  auto file = fs->Open(path, options);
  if (!file.ok()) GTEST_SKIP() << "the scratch file system refuses O_DIRECT: " << file.status();
  const size_t alignment = internal::DirectMemoryAlignment(**file);
  EXPECT_GT(alignment, 0u);
  EXPECT_EQ(alignment & (alignment - 1), 0u) << alignment << " is not a power of two";
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(alignment, internal::DirectMemoryAlignmentOf(fd));
  ::close(fd);
  // A read into memory of exactly that alignment succeeds in place.
  std::unique_ptr<char[]> memory(new char[kDirectIoAlignment * 3]);
  char* at = reinterpret_cast<char*>(AlignUp(reinterpret_cast<uintptr_t>(memory.get()))) + alignment % kDirectIoAlignment;
  auto n = (*file)->ReadAt(0, {at, kDirectIoAlignment});
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, kDirectIoAlignment);
  EXPECT_EQ(std::string(at, 16), std::string(16, 'x'));
}

TEST(ReadChunksTest, ThePoolHoldsOneChunkPerQueueSlotWithinBudget) {
  IoOptions io;
  io.chunk_bytes = 64 << 10;
  io.queue_depth = 32;
  io.buffer_bytes = 64 << 20;
  internal::ReadChunks deep(io, /*largest_record=*/100 << 20, nullptr);
  ASSERT_TRUE(deep.Ensure().ok());
  EXPECT_EQ(deep.count(), 32u);
  io.buffer_bytes = 512 << 10;  // the budget wins
  internal::ReadChunks capped(io, 100 << 20, nullptr);
  ASSERT_TRUE(capped.Ensure().ok());
  EXPECT_EQ(capped.count(), 8u);
  io.buffer_bytes = 64 << 20;  // and a small checkpoint needs little
  internal::ReadChunks small(io, 128 << 10, nullptr);
  ASSERT_TRUE(small.Ensure().ok());
  EXPECT_EQ(small.count(), 4u);
}

// Faulting ahead races with the read filling the same memory: it must map
// pages without changing a byte already there.
TEST(FaultAheadTest, PopulatingKeepsWhatIsThereAndMakesPagesResident) {
  constexpr size_t kBytes = size_t{16} << 20;
  void* p = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  char* memory = static_cast<char*>(p);
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  // Every other page written before, as a read that got there first would.
  for (size_t at = 0; at < kBytes; at += 2 * page) std::memset(memory + at, 0x5a, page);
  if (!internal::FaultAhead::Populate(memory, kBytes)) {
    ::munmap(p, kBytes);
    GTEST_SKIP() << "this kernel has no MADV_POPULATE_WRITE (Linux < 5.14): nothing is faulted ahead";
  }
  std::vector<unsigned char> resident(kBytes / page);
  ASSERT_EQ(::mincore(memory, kBytes, resident.data()), 0);
  for (size_t i = 0; i < resident.size(); ++i) ASSERT_TRUE(resident[i] & 1) << "page " << i;
  for (size_t at = 0; at < kBytes; at += page) {
    const char want = (at / page) % 2 == 0 ? 0x5a : 0;
    ASSERT_EQ(memory[at], want) << "byte " << at;
    ASSERT_EQ(memory[at + page - 1], want) << "byte " << at + page - 1;
  }
  // And on threads, over ranges in read order, while this thread writes.
  {
    std::vector<internal::FaultAhead::Range> ranges = {{memory, kBytes / 2}, {memory + kBytes / 2, kBytes / 2}};
    internal::FaultAhead faulting(ranges, 2);
    for (size_t at = 0; at < kBytes; at += page) memory[at + 7] = static_cast<char>(at / page);
  }
  for (size_t at = 0; at < kBytes; at += page) ASSERT_EQ(memory[at + 7], static_cast<char>(at / page));
  ::munmap(p, kBytes);
}

}  // namespace
}  // namespace ckpt
