// The FileSystem conformance suite as a library (file_system_conformance.h).
// (About 750 lines, over the house ~400: the suite is the contract of the
// seam, and reads best in one place.)
#include "file_system_conformance.h"

#include <fcntl.h>
#include <stdlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "ckpt/file_system.h"
#include "gtest/gtest-spi.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace ckpt {
namespace {

// Expects the message of `status` to contain `text` (a path, usually).
#define EXPECT_MENTIONS(status, text) \
  EXPECT_TRUE(absl::StrContains((status).message(), text)) << (status) << " should name " << (text)

constexpr size_t kDepth = 16;

// An aligned heap buffer (usable for O_DIRECT).
class Buffer {
 public:
  explicit Buffer(size_t size) : size_(size) {
    void* p = nullptr;
    if (posix_memalign(&p, kDirectIoAlignment, std::max<size_t>(size, 1)) != 0) abort();
    data_ = static_cast<uint8_t*>(p);
    std::memset(data_, 0, size_);
  }
  ~Buffer() { free(data_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  uint8_t* data() { return data_; }
  size_t size() const { return size_; }
  std::span<char> chars() { return {reinterpret_cast<char*>(data_), size_}; }
  void Fill(uint64_t seed) {
    std::vector<uint8_t> bytes(size_);
    testing::FillRandom(bytes, seed);
    std::memcpy(data_, bytes.data(), size_);
  }
  bool SameAs(const Buffer& other) const {
    return size_ == other.size_ && std::memcmp(data_, other.data_, size_) == 0;
  }

 private:
  uint8_t* data_;
  size_t size_;
};

// One case's world: a fresh file system from the factory, a queue of the
// configuration's kind, a scratch directory. `SetUp` may skip (GTEST_SKIP)
// a configuration the file system refuses.
class ConformanceFixture {
 public:
  ConformanceFixture(const FileSystemFactory& factory, const ConformanceConfig& config)
      : factory_(factory), config_(config) {}
  virtual ~ConformanceFixture() = default;
  virtual void Body() = 0;

  void SetUp() {
    const ConformanceConfig& p = config_;
    fs_ = factory_();
    ASSERT_NE(fs_, nullptr) << "the factory made no file system";
    auto queue = fs_->NewIoQueue(p.kind, kDepth);
    if (!queue.ok() && queue.status().code() == absl::StatusCode::kUnavailable) {
      CKPT_SKIP_UNLESS_REQUIRED(absl::StrCat("I/O queue refused here: ", queue.status().ToString()));
    }
    ASSERT_TRUE(queue.ok()) << queue.status();
    queue_ = std::move(*queue);
    if (p.direct) {
      OpenOptions probe = WriteOptions();
      auto file = fs_->Open(Path(".direct-probe"), probe);
      if (!file.ok() && file.status().code() == absl::StatusCode::kInvalidArgument) {
        GTEST_SKIP() << dir_.path() << " refuses O_DIRECT: " << file.status();
      }
      ASSERT_TRUE(file.ok()) << file.status();
      ASSERT_TRUE((*file)->Close().ok());
      ASSERT_TRUE(fs_->RemoveFile(Path(".direct-probe")).ok());
    }
  }

  std::string Path(const std::string& name) const { return dir_.Join(name); }
  bool direct() const { return config_.direct; }
  // A transfer size: whole blocks for O_DIRECT, an odd size otherwise.
  size_t Size(size_t blocks) const {
    return direct() ? blocks * kDirectIoAlignment : blocks * kDirectIoAlignment - 123;
  }

  OpenOptions WriteOptions(bool exclusive = false) const {
    OpenOptions o;
    o.write = true;
    o.create = true;
    o.exclusive = exclusive;
    o.direct = config_.direct;
    return o;
  }
  OpenOptions ReadOptions() const {
    OpenOptions o;
    o.direct = config_.direct;
    return o;
  }

  std::unique_ptr<File> OpenOrDie(const std::string& path, const OpenOptions& options) {
    auto file = fs_->Open(path, options);
    EXPECT_TRUE(file.ok()) << file.status();
    return file.ok() ? std::move(*file) : nullptr;
  }

  // Runs `ops` to completion as the library does: at most `depth()` in
  // flight, short transfers resubmitted for their remainder, -EINTR and
  // -EAGAIN resubmitted. Returns per op the bytes transferred or -errno.
  std::vector<int64_t> RunOps(std::vector<IoOp> ops) {
    std::vector<int64_t> done(ops.size(), 0);
    std::vector<bool> final(ops.size(), false);
    std::deque<size_t> ready;
    for (size_t i = 0; i < ops.size(); ++i) {
      ops[i].tag = i;
      ready.push_back(i);
    }
    size_t in_flight = 0;
    while (!ready.empty() || in_flight > 0) {
      while (!ready.empty() && in_flight < queue_->depth()) {
        IoOp op = ops[ready.front()];
        op.offset += static_cast<uint64_t>(done[op.tag]);
        op.buf = static_cast<char*>(op.buf) + done[op.tag];
        op.length -= static_cast<uint32_t>(done[op.tag]);
        absl::Status s = queue_->Submit({&op, 1});
        EXPECT_TRUE(s.ok()) << s;
        if (!s.ok()) return done;
        ready.pop_front();
        ++in_flight;
      }
      std::vector<IoCompletion> completions;
      absl::Status s = queue_->Reap(1, &completions);
      EXPECT_TRUE(s.ok()) << s;
      if (!s.ok()) return done;
      for (const IoCompletion& c : completions) {
        --in_flight;
        const int64_t r = c.result;
        const uint64_t i = c.tag;
        if (r == -EINTR || r == -EAGAIN) {
          ready.push_back(i);
        } else if (r < 0) {
          done[i] = r;
          final[i] = true;
        } else {
          done[i] += r;
          if (r > 0 && done[i] < static_cast<int64_t>(ops[i].length)) ready.push_back(i);
        }
      }
    }
    return done;
  }

  void WriteAll(File* file, uint64_t offset, Buffer& buffer) {
    auto results = RunOps({IoOp{IoOp::Kind::kWrite, file, offset, buffer.data(),
                                static_cast<uint32_t>(buffer.size()), -1, 0}});
    ASSERT_EQ(results[0], static_cast<int64_t>(buffer.size())) << file->path();
  }

  // Reads `size` bytes at `offset`; for O_DIRECT the read is of whole blocks
  // and may end early at end of file.
  int64_t ReadSome(File* file, uint64_t offset, Buffer& buffer) {
    return RunOps({IoOp{IoOp::Kind::kRead, file, offset, buffer.data(),
                        static_cast<uint32_t>(buffer.size()), -1, 0}})[0];
  }

  void WriteFile(const std::string& name, size_t size, uint64_t seed) {
    auto file = OpenOrDie(Path(name), WriteOptions());
    ASSERT_NE(file, nullptr);
    Buffer buffer(direct() ? AlignUp(size) : size);
    buffer.Fill(seed);
    WriteAll(file.get(), 0, buffer);
    ASSERT_TRUE(file->Truncate(size).ok());
    ASSERT_TRUE(file->Close().ok());
  }

  const FileSystemFactory& factory_;
  const ConformanceConfig config_;
  testing::ScratchDir dir_{"ckpt-conformance"};
  std::shared_ptr<FileSystem> fs_;
  std::unique_ptr<IoQueue> queue_;
};

struct Case {
  const char* name;
  std::unique_ptr<ConformanceFixture> (*make)(const FileSystemFactory&, const ConformanceConfig&);
};

std::vector<Case>& Cases() {
  static std::vector<Case>* const cases = new std::vector<Case>;
  return *cases;
}

bool AddCase(const char* name, std::unique_ptr<ConformanceFixture> (*make)(const FileSystemFactory&,
                                                                           const ConformanceConfig&)) {
  Cases().push_back(Case{name, make});
  return true;
}

// One case: a fixture class, registered (in this file's static
// initialization, before any test runs) under `name`.
#define CONFORMANCE_CASE(name)                                                                   \
  class Case_##name final : public ConformanceFixture {                                          \
   public:                                                                                       \
    using ConformanceFixture::ConformanceFixture;                                                \
    void Body() override;                                                                        \
  };                                                                                             \
  const bool kAdded_##name = AddCase(#name, [](const FileSystemFactory& f, const ConformanceConfig& c) \
                                                -> std::unique_ptr<ConformanceFixture> {         \
                                              return std::make_unique<Case_##name>(f, c);        \
                                            });                                                  \
  void Case_##name::Body()

CONFORMANCE_CASE(OpenMissingFileIsNotFoundNamingPath) {
  auto file = fs_->Open(Path("missing"), ReadOptions());
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound) << file.status();
  EXPECT_MENTIONS(file.status(), Path("missing"));
}

CONFORMANCE_CASE(OpenReportsPathAndDirect) {
  auto file = OpenOrDie(Path("f"), WriteOptions());
  ASSERT_NE(file, nullptr);
  EXPECT_EQ(file->path(), Path("f"));
  EXPECT_EQ(file->direct(), direct());
  EXPECT_TRUE(file->Close().ok());
}

CONFORMANCE_CASE(ExclusiveCreateOfExistingFileIsAlreadyExists) {
  WriteFile("f", Size(1), 1);
  auto again = fs_->Open(Path("f"), WriteOptions(/*exclusive=*/true));
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists) << again.status();
  EXPECT_MENTIONS(again.status(), Path("f"));
}

CONFORMANCE_CASE(CreateOpensExistingFileAndTruncateEmptiesIt) {
  WriteFile("f", Size(2), 1);
  {
    auto file = OpenOrDie(Path("f"), WriteOptions());
    ASSERT_NE(file, nullptr);
    auto size = file->Size();
    ASSERT_TRUE(size.ok()) << size.status();
    EXPECT_EQ(*size, Size(2));
    EXPECT_TRUE(file->Close().ok());
  }
  OpenOptions truncate = WriteOptions();
  truncate.truncate = true;
  auto file = OpenOrDie(Path("f"), truncate);
  ASSERT_NE(file, nullptr);
  auto size = file->Size();
  ASSERT_TRUE(size.ok()) << size.status();
  EXPECT_EQ(*size, 0u);
  EXPECT_TRUE(file->Close().ok());
}

CONFORMANCE_CASE(WriteThenReadBackThroughQueue) {
  auto file = OpenOrDie(Path("data"), WriteOptions());
  ASSERT_NE(file, nullptr);
  Buffer a(Size(3)), b(direct() ? Size(2) : 777);
  a.Fill(1);
  b.Fill(2);
  WriteAll(file.get(), 0, a);
  const uint64_t b_offset = direct() ? Size(3) : Size(3) + 1000;  // leaves a hole if buffered
  WriteAll(file.get(), b_offset, b);
  ASSERT_TRUE(file->Close().ok());

  auto reader = OpenOrDie(Path("data"), ReadOptions());
  ASSERT_NE(reader, nullptr);
  Buffer a2(a.size()), b2(b.size());
  EXPECT_EQ(ReadSome(reader.get(), 0, a2), static_cast<int64_t>(a.size()));
  EXPECT_TRUE(a.SameAs(a2));
  EXPECT_EQ(ReadSome(reader.get(), b_offset, b2), static_cast<int64_t>(b.size()));
  EXPECT_TRUE(b.SameAs(b2));
  if (!direct()) {
    Buffer hole(1000);
    hole.Fill(3);
    EXPECT_EQ(ReadSome(reader.get(), Size(3), hole), 1000);
    EXPECT_TRUE(std::all_of(hole.data(), hole.data() + 1000, [](uint8_t c) { return c == 0; }));
  }
  EXPECT_TRUE(reader->Close().ok());
}

CONFORMANCE_CASE(ReadAtEndOfFileTransfersNothing) {
  WriteFile("f", direct() ? Size(1) : 100, 1);
  auto file = OpenOrDie(Path("f"), ReadOptions());
  ASSERT_NE(file, nullptr);
  Buffer buffer(Size(1));
  EXPECT_EQ(ReadSome(file.get(), Size(4), buffer), 0);
  if (!direct()) {
    // A read across the end stops there.
    EXPECT_EQ(ReadSome(file.get(), 0, buffer), 100);
  }
}

CONFORMANCE_CASE(ManyOpsInFlightAcrossFiles) {
  constexpr int kFiles = 4;
  constexpr int kBlocksPerFile = 12;  // 48 ops through a queue of depth 16
  const size_t block = direct() ? kDirectIoAlignment : 5000;
  std::vector<std::unique_ptr<File>> files;
  std::vector<std::unique_ptr<Buffer>> buffers;
  std::vector<IoOp> ops;
  for (int f = 0; f < kFiles; ++f) {
    files.push_back(OpenOrDie(Path("file" + std::to_string(f)), WriteOptions()));
    ASSERT_NE(files.back(), nullptr);
    for (int b = 0; b < kBlocksPerFile; ++b) {
      buffers.push_back(std::make_unique<Buffer>(block));
      buffers.back()->Fill(f * 100 + b);
      // Written back to front, interleaved across files.
      ops.push_back(IoOp{IoOp::Kind::kWrite, files.back().get(),
                         (kBlocksPerFile - 1 - b) * block, buffers.back()->data(),
                         static_cast<uint32_t>(block), -1, 0});
    }
  }
  std::vector<int64_t> results = RunOps(ops);
  for (size_t i = 0; i < ops.size(); ++i) EXPECT_EQ(results[i], static_cast<int64_t>(block)) << i;
  for (auto& file : files) {
    auto size = file->Size();
    ASSERT_TRUE(size.ok()) << size.status();
    EXPECT_EQ(*size, kBlocksPerFile * block);
    EXPECT_TRUE(file->Sync().ok());
    EXPECT_TRUE(file->Close().ok());
  }
  for (int f = 0; f < kFiles; ++f) {
    auto file = OpenOrDie(Path("file" + std::to_string(f)), ReadOptions());
    ASSERT_NE(file, nullptr);
    for (int b = 0; b < kBlocksPerFile; ++b) {
      Buffer back(block);
      EXPECT_EQ(ReadSome(file.get(), (kBlocksPerFile - 1 - b) * block, back),
                static_cast<int64_t>(block));
      EXPECT_TRUE(back.SameAs(*buffers[f * kBlocksPerFile + b])) << "file " << f << " block " << b;
    }
  }
}

CONFORMANCE_CASE(ReapReturnsEveryCompletionOnceWithItsTag) {
  EXPECT_EQ(queue_->depth(), kDepth);
  EXPECT_FALSE(queue_->name().empty());
  std::vector<IoCompletion> none;
  ASSERT_TRUE(queue_->Reap(0, &none).ok());  // nothing in flight: returns at once
  EXPECT_TRUE(none.empty());

  auto file = OpenOrDie(Path("f"), WriteOptions());
  ASSERT_NE(file, nullptr);
  const size_t block = direct() ? kDirectIoAlignment : 3000;
  std::vector<std::unique_ptr<Buffer>> buffers;
  std::vector<IoOp> ops;
  for (size_t i = 0; i < kDepth; ++i) {  // a whole queue's worth in one Submit
    buffers.push_back(std::make_unique<Buffer>(block));
    buffers.back()->Fill(i);
    ops.push_back(IoOp{IoOp::Kind::kWrite, file.get(), i * block, buffers.back()->data(),
                       static_cast<uint32_t>(block), -1, 0xC0FFEE0000ull + i * 7});
  }
  ASSERT_TRUE(queue_->Submit(ops).ok());
  std::vector<IoCompletion> completions;
  ASSERT_TRUE(queue_->Reap(4, &completions).ok());
  EXPECT_GE(completions.size(), 4u);
  while (completions.size() < kDepth) {
    size_t before = completions.size();
    ASSERT_TRUE(queue_->Reap(1, &completions).ok());
    ASSERT_GT(completions.size(), before);
  }
  EXPECT_EQ(completions.size(), kDepth);
  std::set<uint64_t> tags;
  for (const IoCompletion& c : completions) {
    EXPECT_GT(c.result, 0) << "tag " << c.tag;
    EXPECT_TRUE(tags.insert(c.tag).second) << "tag " << c.tag << " reaped twice";
  }
  for (const IoOp& op : ops) EXPECT_EQ(tags.count(op.tag), 1u) << op.tag;
  completions.clear();
  ASSERT_TRUE(queue_->Reap(0, &completions).ok());
  EXPECT_TRUE(completions.empty());
}

CONFORMANCE_CASE(TransferErrorsArriveInCompletions) {
  WriteFile("f", Size(1), 1);
  auto file = OpenOrDie(Path("f"), ReadOptions());  // read-only
  ASSERT_NE(file, nullptr);
  Buffer buffer(Size(1));
  IoOp op{IoOp::Kind::kWrite, file.get(), 0, buffer.data(), static_cast<uint32_t>(Size(1)), -1, 42};
  ASSERT_TRUE(queue_->Submit({&op, 1}).ok());
  std::vector<IoCompletion> completions;
  ASSERT_TRUE(queue_->Reap(1, &completions).ok());
  ASSERT_EQ(completions.size(), 1u);
  EXPECT_EQ(completions[0].tag, 42u);
  EXPECT_EQ(completions[0].result, -EBADF);
}

CONFORMANCE_CASE(RegisteredBuffersCarryData) {
  Buffer buffer(Size(2));
  buffer.Fill(9);
  std::span<char> region = buffer.chars();
  absl::Status registered = queue_->RegisterBuffers({&region, 1});
  if (registered.code() == absl::StatusCode::kUnimplemented) return;  // allowed
  ASSERT_TRUE(registered.ok()) << registered;
  auto file = OpenOrDie(Path("f"), WriteOptions());
  ASSERT_NE(file, nullptr);
  auto results = RunOps({IoOp{IoOp::Kind::kWrite, file.get(), 0, buffer.data(),
                              static_cast<uint32_t>(buffer.size()), 0, 0}});
  EXPECT_EQ(results[0], static_cast<int64_t>(buffer.size()));
  Buffer back(buffer.size());
  EXPECT_EQ(ReadSome(file.get(), 0, back), static_cast<int64_t>(buffer.size()));
  EXPECT_TRUE(back.SameAs(buffer));
  EXPECT_TRUE(queue_->RegisterBuffers({}).ok());
}

// ---- File::ReadAt and File::WriteAt: the synchronous path of small files.

CONFORMANCE_CASE(WriteAtThenReadAtRoundTripsAtOffsets) {
  auto file = OpenOrDie(Path("small"), WriteOptions());
  ASSERT_NE(file, nullptr);
  Buffer a(Size(2)), b(direct() ? Size(1) : 300);
  a.Fill(1);
  b.Fill(2);
  ASSERT_TRUE(file->WriteAt(0, a.chars()).ok());
  const uint64_t b_offset = direct() ? Size(3) : Size(2) + 500;  // leaves a hole
  ASSERT_TRUE(file->WriteAt(b_offset, b.chars()).ok());
  ASSERT_TRUE(file->WriteAt(0, std::span<const char>()).ok());  // nothing to write
  auto size = file->Size();
  ASSERT_TRUE(size.ok()) << size.status();
  EXPECT_EQ(*size, b_offset + b.size());
  ASSERT_TRUE(file->Sync().ok());
  ASSERT_TRUE(file->Close().ok());

  auto reader = OpenOrDie(Path("small"), ReadOptions());
  ASSERT_NE(reader, nullptr);
  Buffer a2(a.size()), b2(b.size());
  auto read = reader->ReadAt(0, a2.chars());
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, a.size());
  EXPECT_TRUE(a.SameAs(a2));
  read = reader->ReadAt(b_offset, b2.chars());
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, b.size());
  EXPECT_TRUE(b.SameAs(b2));
  Buffer hole(direct() ? Size(1) : 500);
  hole.Fill(3);
  read = reader->ReadAt(Size(2), hole.chars());
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, hole.size());
  EXPECT_TRUE(std::all_of(hole.data(), hole.data() + hole.size(), [](uint8_t c) { return c == 0; }));
  read = reader->ReadAt(0, std::span<char>());
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, 0u);
  EXPECT_TRUE(reader->Close().ok());
}

CONFORMANCE_CASE(ReadAtStopsAtEndOfFile) {
  WriteFile("f", direct() ? Size(2) : 1000, 4);
  auto file = OpenOrDie(Path("f"), ReadOptions());
  ASSERT_NE(file, nullptr);
  Buffer buffer(Size(3));
  auto read = file->ReadAt(0, buffer.chars());  // across the end: what there is
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, direct() ? Size(2) : 1000u);
  read = file->ReadAt(Size(8), buffer.chars());  // past the end: nothing
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, 0u);
  if (!direct()) {
    read = file->ReadAt(1000, buffer.chars());  // exactly at the end
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(*read, 0u);
  }
  EXPECT_TRUE(file->Close().ok());
}

CONFORMANCE_CASE(WriteAtAndQueueWritesSeeEachOther) {
  auto file = OpenOrDie(Path("f"), WriteOptions());
  ASSERT_NE(file, nullptr);
  Buffer queued(Size(2)), direct_write(Size(1));
  queued.Fill(5);
  direct_write.Fill(6);
  WriteAll(file.get(), 0, queued);
  ASSERT_TRUE(file->WriteAt(Size(2), direct_write.chars()).ok());
  ASSERT_TRUE(file->Close().ok());
  auto reader = OpenOrDie(Path("f"), ReadOptions());
  ASSERT_NE(reader, nullptr);
  Buffer back(Size(2));
  auto read = reader->ReadAt(0, back.chars());
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, back.size());
  EXPECT_TRUE(back.SameAs(queued));
  Buffer tail(Size(1));
  EXPECT_EQ(ReadSome(reader.get(), Size(2), tail), static_cast<int64_t>(tail.size()));
  EXPECT_TRUE(tail.SameAs(direct_write));
}

CONFORMANCE_CASE(ReadAtAndWriteAtErrorsNameThePath) {
  WriteFile("f", Size(1), 1);
  auto read_only = OpenOrDie(Path("f"), ReadOptions());
  ASSERT_NE(read_only, nullptr);
  Buffer buffer(Size(1));
  buffer.Fill(7);
  absl::Status written = read_only->WriteAt(0, buffer.chars());
  EXPECT_FALSE(written.ok());
  EXPECT_MENTIONS(written, Path("f"));
  auto size = read_only->Size();
  ASSERT_TRUE(size.ok());
  EXPECT_EQ(*size, Size(1));  // nothing changed

  OpenOptions write_only = WriteOptions();
  write_only.read = false;
  auto writer = OpenOrDie(Path("f"), write_only);
  ASSERT_NE(writer, nullptr);
  auto read = writer->ReadAt(0, buffer.chars());
  ASSERT_FALSE(read.ok());
  EXPECT_MENTIONS(read.status(), Path("f"));
}

// A file the queue's file system did not open (another implementation's) is
// refused at `Submit`, before anything starts.
class ForeignFile final : public File {
 public:
  const std::string& path() const override { return path_; }
  bool direct() const override { return false; }
  absl::StatusOr<size_t> ReadAt(uint64_t, std::span<char>) override { return 0; }
  absl::Status WriteAt(uint64_t, std::span<const char>) override { return absl::OkStatus(); }
  absl::Status Sync() override { return absl::OkStatus(); }
  absl::Status Truncate(uint64_t) override { return absl::OkStatus(); }
  absl::StatusOr<uint64_t> Size() override { return 0; }
  absl::Status DropCache() override { return absl::OkStatus(); }
  absl::Status Close() override { return absl::OkStatus(); }

 private:
  const std::string path_ = "/foreign/file";
};

CONFORMANCE_CASE(QueueRefusesAFileItCannotUse) {
  auto file = OpenOrDie(Path("f"), WriteOptions());
  ASSERT_NE(file, nullptr);
  ForeignFile foreign;
  Buffer buffer(Size(1));
  std::vector<IoOp> ops = {
      IoOp{IoOp::Kind::kWrite, file.get(), 0, buffer.data(), static_cast<uint32_t>(Size(1)), -1, 1},
      IoOp{IoOp::Kind::kWrite, &foreign, 0, buffer.data(), static_cast<uint32_t>(Size(1)), -1, 2}};
  absl::Status submitted = queue_->Submit(ops);
  EXPECT_EQ(submitted.code(), absl::StatusCode::kInvalidArgument) << submitted;
  EXPECT_MENTIONS(submitted, "/foreign/file");
  std::vector<IoCompletion> completions;
  ASSERT_TRUE(queue_->Reap(0, &completions).ok());
  EXPECT_TRUE(completions.empty());  // neither op started
  auto size = file->Size();
  ASSERT_TRUE(size.ok());
  EXPECT_EQ(*size, 0u);
  // The queue still works.
  EXPECT_EQ(RunOps({ops[0]})[0], static_cast<int64_t>(Size(1)));
}

// Allocate reserves space ahead of writes (or says it cannot): the file
// reads as zeros up to the size, writes land inside it, and the size only
// grows.
CONFORMANCE_CASE(AllocateReservesZeroedSpaceOrIsUnimplemented) {
  auto file = OpenOrDie(Path("f"), WriteOptions());
  ASSERT_NE(file, nullptr);
  absl::Status allocated = file->Allocate(Size(8));
  if (allocated.code() == absl::StatusCode::kUnimplemented) GTEST_SKIP() << allocated;
  ASSERT_TRUE(allocated.ok()) << allocated;
  auto size = file->Size();
  ASSERT_TRUE(size.ok());
  EXPECT_EQ(*size, Size(8));
  Buffer data(Size(2));
  data.Fill(9);
  WriteAll(file.get(), Size(3), data);
  ASSERT_TRUE(file->Allocate(Size(4)).ok());  // never shrinks
  size = file->Size();
  ASSERT_TRUE(size.ok());
  EXPECT_EQ(*size, Size(8));
  Buffer zeros(Size(3));
  Buffer read(Size(3));
  read.Fill(1);
  ASSERT_EQ(ReadSome(file.get(), 0, read), static_cast<int64_t>(Size(3)));
  EXPECT_TRUE(read.SameAs(zeros));
  Buffer back(Size(2));
  ASSERT_EQ(ReadSome(file.get(), Size(3), back), static_cast<int64_t>(Size(2)));
  EXPECT_TRUE(back.SameAs(data));
  EXPECT_TRUE(file->Close().ok());
}

CONFORMANCE_CASE(SizeTruncateSyncDropCacheClose) {
  auto file = OpenOrDie(Path("f"), WriteOptions());
  ASSERT_NE(file, nullptr);
  auto size = file->Size();
  ASSERT_TRUE(size.ok());
  EXPECT_EQ(*size, 0u);
  Buffer buffer(Size(3));
  buffer.Fill(5);
  WriteAll(file.get(), 0, buffer);
  size = file->Size();
  ASSERT_TRUE(size.ok());
  EXPECT_EQ(*size, Size(3));
  ASSERT_TRUE(file->Truncate(5000).ok());  // not block aligned, even for O_DIRECT
  size = file->Size();
  ASSERT_TRUE(size.ok());
  EXPECT_EQ(*size, 5000u);
  ASSERT_TRUE(file->Truncate(3 * kDirectIoAlignment + 1).ok());  // grows with zeros
  size = file->Size();
  ASSERT_TRUE(size.ok());
  EXPECT_EQ(*size, 3 * kDirectIoAlignment + 1);
  EXPECT_TRUE(file->Sync().ok());
  EXPECT_TRUE(file->DropCache().ok());
  EXPECT_TRUE(file->Close().ok());
  auto stat = fs_->Stat(Path("f"));
  ASSERT_TRUE(stat.ok()) << stat.status();
  EXPECT_EQ(stat->size, 3 * kDirectIoAlignment + 1);
}

CONFORMANCE_CASE(ListDirNamesEntriesWithoutDots) {
  WriteFile("a", 10, 1);
  WriteFile(".hidden", 10, 2);
  ASSERT_TRUE(fs_->CreateDir(Path("sub")).ok());
  auto names = fs_->ListDir(dir_.path());
  ASSERT_TRUE(names.ok()) << names.status();
  std::vector<std::string> sorted = *names;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, (std::vector<std::string>{".hidden", "a", "sub"}));
  auto empty = fs_->ListDir(Path("sub"));
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE(empty->empty());
  auto missing = fs_->ListDir(Path("missing"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_MENTIONS(missing.status(), Path("missing"));
}

CONFORMANCE_CASE(StatReportsKindAndSizeOrNotFound) {
  WriteFile("f", 1234, 1);
  auto file = fs_->Stat(Path("f"));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_FALSE(file->is_directory);
  EXPECT_EQ(file->size, 1234u);
  EXPECT_GT(file->mtime_ns, 0);
  auto dir = fs_->Stat(dir_.path());
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_TRUE(dir->is_directory);
  auto missing = fs_->Stat(Path("missing"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_MENTIONS(missing.status(), Path("missing"));
}

CONFORMANCE_CASE(CreateDirOfExistingPathIsAlreadyExists) {
  ASSERT_TRUE(fs_->CreateDir(Path("d")).ok());
  absl::Status again = fs_->CreateDir(Path("d"));
  EXPECT_EQ(again.code(), absl::StatusCode::kAlreadyExists) << again;
  EXPECT_MENTIONS(again, Path("d"));
  WriteFile("f", 1, 1);
  EXPECT_EQ(fs_->CreateDir(Path("f")).code(), absl::StatusCode::kAlreadyExists);
  absl::Status orphan = fs_->CreateDir(Path("no/such/parent"));
  EXPECT_EQ(orphan.code(), absl::StatusCode::kNotFound) << orphan;
  EXPECT_MENTIONS(orphan, Path("no/such/parent"));
}

CONFORMANCE_CASE(RenameReplaceOverwritesTarget) {
  WriteFile("from", 100, 1);
  WriteFile("to", 200, 2);
  ASSERT_TRUE(fs_->Rename(Path("from"), Path("to"), RenameMode::kReplace).ok());
  EXPECT_EQ(fs_->Stat(Path("from")).status().code(), absl::StatusCode::kNotFound);
  auto stat = fs_->Stat(Path("to"));
  ASSERT_TRUE(stat.ok());
  EXPECT_EQ(stat->size, 100u);
}

CONFORMANCE_CASE(RenameNoReplaceRefusesExistingTarget) {
  WriteFile("from", 100, 1);
  WriteFile("to", 200, 2);
  absl::Status s = fs_->Rename(Path("from"), Path("to"), RenameMode::kNoReplace);
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists) << s;
  EXPECT_MENTIONS(s, Path("to"));
  auto from = fs_->Stat(Path("from"));
  auto to = fs_->Stat(Path("to"));
  ASSERT_TRUE(from.ok() && to.ok());
  EXPECT_EQ(from->size, 100u);
  EXPECT_EQ(to->size, 200u);
  // Into a free name it renames, directories included.
  ASSERT_TRUE(fs_->CreateDir(Path("dir")).ok());
  WriteFile("dir/inner", 7, 3);
  ASSERT_TRUE(fs_->Rename(Path("dir"), Path("moved"), RenameMode::kNoReplace).ok());
  auto inner = fs_->Stat(Path("moved/inner"));
  ASSERT_TRUE(inner.ok()) << inner.status();
  EXPECT_EQ(inner->size, 7u);
  EXPECT_EQ(fs_->Stat(Path("dir")).status().code(), absl::StatusCode::kNotFound);
}

CONFORMANCE_CASE(RenameOfMissingSourceIsNotFoundNamingIt) {
  for (RenameMode mode : {RenameMode::kReplace, RenameMode::kNoReplace}) {
    absl::Status s = fs_->Rename(Path("missing"), Path("to"), mode);
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
    EXPECT_MENTIONS(s, Path("missing"));
  }
}

CONFORMANCE_CASE(ExchangeSwapsDirectoriesAtomicallyOrIsUnimplemented) {
  ASSERT_TRUE(fs_->CreateDir(Path("a")).ok());
  ASSERT_TRUE(fs_->CreateDir(Path("b")).ok());
  WriteFile("a/in_a", 11, 1);
  WriteFile("b/in_b", 22, 2);
  absl::Status s = fs_->Exchange(Path("a"), Path("b"));
  if (s.code() == absl::StatusCode::kUnimplemented) {
    EXPECT_MENTIONS(s, Path("a"));
    GTEST_SKIP() << "no RENAME_EXCHANGE here: " << s;
  }
  ASSERT_TRUE(s.ok()) << s;
  auto moved_a = fs_->Stat(Path("b/in_a"));
  auto moved_b = fs_->Stat(Path("a/in_b"));
  ASSERT_TRUE(moved_a.ok() && moved_b.ok());
  EXPECT_EQ(moved_a->size, 11u);
  EXPECT_EQ(moved_b->size, 22u);
  EXPECT_EQ(fs_->Stat(Path("a/in_a")).status().code(), absl::StatusCode::kNotFound);
  // Both must exist.
  absl::Status missing = fs_->Exchange(Path("a"), Path("missing"));
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound) << missing;
  EXPECT_MENTIONS(missing, Path("missing"));
  EXPECT_TRUE(fs_->Stat(Path("a/in_b")).ok());
}

CONFORMANCE_CASE(RemoveFileAndRemoveDir) {
  WriteFile("f", 10, 1);
  ASSERT_TRUE(fs_->CreateDir(Path("d")).ok());
  WriteFile("d/inner", 10, 2);
  absl::Status not_empty = fs_->RemoveDir(Path("d"));
  EXPECT_FALSE(not_empty.ok());
  EXPECT_MENTIONS(not_empty, Path("d"));
  ASSERT_TRUE(fs_->RemoveFile(Path("d/inner")).ok());
  ASSERT_TRUE(fs_->RemoveDir(Path("d")).ok());
  ASSERT_TRUE(fs_->RemoveFile(Path("f")).ok());
  auto names = fs_->ListDir(dir_.path());
  ASSERT_TRUE(names.ok());
  EXPECT_TRUE(names->empty());
  absl::Status missing = fs_->RemoveFile(Path("f"));
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound) << missing;
  EXPECT_MENTIONS(missing, Path("f"));
  missing = fs_->RemoveDir(Path("d"));
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound) << missing;
  EXPECT_MENTIONS(missing, Path("d"));
}

CONFORMANCE_CASE(SyncDirSyncsDirectoriesAndNamesMissingOnes) {
  ASSERT_TRUE(fs_->CreateDir(Path("d")).ok());
  WriteFile("d/f", 10, 1);
  EXPECT_TRUE(fs_->SyncDir(Path("d")).ok());
  EXPECT_TRUE(fs_->SyncDir(dir_.path()).ok());
  absl::Status missing = fs_->SyncDir(Path("missing"));
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound) << missing;
  EXPECT_MENTIONS(missing, Path("missing"));
}

// Runs `c` and reports into the calling test: failures as failures naming
// the case and configuration; a skip (a configuration the file system
// refuses) as a note, so that one refusal does not mark the whole suite
// skipped. Returns whether it ran to the end without failing.
bool RunCase(const Case& c, const FileSystemFactory& factory, const ConformanceConfig& config) {
  ::testing::TestPartResultArray results;
  {
    ::testing::ScopedFakeTestPartResultReporter capture(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ALL_THREADS, &results);
    std::unique_ptr<ConformanceFixture> fixture = c.make(factory, config);
    fixture->SetUp();
    bool stop = false;
    for (int i = 0; i < results.size(); ++i) stop |= results.GetTestPartResult(i).skipped() ||
                                                     results.GetTestPartResult(i).fatally_failed();
    if (!stop) fixture->Body();
  }
  bool ok = true;
  for (int i = 0; i < results.size(); ++i) {
    const ::testing::TestPartResult& r = results.GetTestPartResult(i);
    if (r.skipped()) {
      std::cout << "[ conformance ] " << c.name << " [" << config.name << "] skipped: " << r.message()
                << std::endl;
      continue;
    }
    ok = false;
    ADD_FAILURE_AT(r.file_name() != nullptr ? r.file_name() : __FILE__, r.line_number())
        << c.name << " [" << config.name << "]: " << r.message();
  }
  return ok;
}

}  // namespace

std::vector<ConformanceConfig> AllConformanceConfigs() {
  std::vector<ConformanceConfig> configs;
  for (IoQueueKind kind : {IoQueueKind::kUring, IoQueueKind::kThreads}) {
    for (bool direct : {false, true}) {
      configs.push_back(ConformanceConfig{
          absl::StrCat(kind == IoQueueKind::kUring ? "Uring" : "Threads", direct ? "Direct" : "Buffered"),
          kind, direct});
    }
  }
  return configs;
}

std::vector<std::string> ConformanceCaseNames() {
  std::vector<std::string> names;
  for (const Case& c : Cases()) names.push_back(c.name);
  return names;
}

bool RunFileSystemConformance(const FileSystemFactory& factory, const ConformanceConfig& config) {
  bool ok = true;
  for (const Case& c : Cases()) ok &= RunCase(c, factory, config);
  return ok;
}

bool RunFileSystemConformance(const FileSystemFactory& factory) {
  bool ok = true;
  for (const ConformanceConfig& config : AllConformanceConfigs()) {
    ok &= RunFileSystemConformance(factory, config);
  }
  return ok;
}

}  // namespace ckpt
