// Tied weights read into one storage (`Reader::ReadInto`): two names whose
// records hold the same value, read into the same memory at a delta step,
// fill it once — each delta applied once, no checksum mismatch, no
// link-by-link re-check logged, through `ReadInto` and `ReadRegions` — and
// two names of different values (or boxes) read into the same memory are
// refused before anything is read.
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "ckpt/engine.h"
#include "ckpt/log.h"
#include "ckpt/reader.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace ckpt {
namespace {

using testing::OwnedTensor;
using testing::RandomTensor;
using testing::SameBytes;
using testing::ScratchDir;

constexpr int kSaves = 4;

// Saves a full step and exact deltas of a state in which "embed.w" and
// "head.w" are one weight saved under two names (as a state_dict of a model
// with tied embeddings holds it, written by a writer that stores both), and
// "other.w" differs; every element of the tied weight moves at each step.
class TiedReadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = dir_.Join("root");
    EngineOptions options = testing::SmallChunks();
    options.delta.mode = DeltaOptions::Mode::kExact;
    options.delta.full_every = kSaves;
    auto engine = Engine::Open(root_, options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    tied_ = RandomTensor("embed.w", DType::kFloat32, {64, 96}, 1);
    other_ = RandomTensor("other.w", DType::kFloat32, {500}, 2);
    std::mt19937_64 rng(3);
    for (int step = 1; step <= kSaves; ++step) {
      for (size_t i = 0; i + 4 <= tied_.bytes.size(); i += 4) tied_.bytes[i] ^= static_cast<uint8_t>(rng() | 1);
      other_.bytes[step] ^= 0x11;
      OwnedTensor head = tied_;
      head.name = "head.w";
      auto stats = (*engine)->Save(step, testing::Views({tied_, head, other_}));
      ASSERT_TRUE(stats.ok()) << stats.status();
      ASSERT_EQ(stats->kind, step == 1 ? CheckpointKind::kFull : CheckpointKind::kDelta);
    }
    ASSERT_TRUE((*engine)->Close().ok());
    SetLogSink([this](LogSeverity severity, absl::string_view message) {
      std::lock_guard<std::mutex> lock(mu_);
      if (severity >= LogSeverity::kWarning) warnings_.emplace_back(message);
    });
  }
  void TearDown() override { SetLogSink(nullptr); }

  std::unique_ptr<Reader> Open() {
    ReaderOptions options;
    options.step = kSaves;
    auto reader = Reader::Open(root_, options);
    EXPECT_TRUE(reader.ok()) << reader.status();
    return reader.ok() ? std::move(*reader) : nullptr;
  }

  ScratchDir dir_;
  std::string root_;
  OwnedTensor tied_, other_;
  std::mutex mu_;
  std::vector<std::string> warnings_;
};

TEST_F(TiedReadTest, OneStorageUnderTwoNamesIsFilledOnce) {
  std::unique_ptr<Reader> reader = Open();
  ASSERT_NE(reader, nullptr);
  std::vector<uint8_t> storage(tied_.bytes.size());
  std::vector<ReadTarget> targets = {{"embed.w", storage.data(), storage.size()},
                                     {"head.w", storage.data(), storage.size()}};
  ASSERT_TRUE(reader->ReadInto(targets).ok());
  EXPECT_TRUE(SameBytes(storage.data(), tied_.bytes.data(), storage.size()));
  std::lock_guard<std::mutex> lock(mu_);
  for (const std::string& w : warnings_) {
    EXPECT_FALSE(absl::StrContains(w, "link by link")) << w;
  }
  EXPECT_TRUE(warnings_.empty());
}

TEST_F(TiedReadTest, RegionReadsOfOneStorageUnderTwoNamesFillItOnce) {
  std::unique_ptr<Reader> reader = Open();
  ASSERT_NE(reader, nullptr);
  std::vector<uint8_t> storage(tied_.bytes.size());
  std::vector<RegionTarget> targets = {{"embed.w", {0, 0}, {64, 96}, storage.data(), storage.size()},
                                       {"head.w", {0, 0}, {64, 96}, storage.data(), storage.size()}};
  ASSERT_TRUE(reader->ReadRegions(targets).ok());
  EXPECT_TRUE(SameBytes(storage.data(), tied_.bytes.data(), storage.size()));
  {
    std::lock_guard<std::mutex> lock(mu_);
    EXPECT_TRUE(warnings_.empty()) << warnings_.front();
  }
  targets[1].shape = {32, 96};
  absl::Status status = reader->ReadRegions(targets);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "different boxes")) << status;
}

TEST_F(TiedReadTest, EachNameIntoItsOwnMemoryStillReadsBoth) {
  std::unique_ptr<Reader> reader = Open();
  ASSERT_NE(reader, nullptr);
  std::vector<uint8_t> a(tied_.bytes.size()), b(tied_.bytes.size());
  std::vector<ReadTarget> targets = {{"embed.w", a.data(), a.size()}, {"head.w", b.data(), b.size()}};
  ASSERT_TRUE(reader->ReadInto(targets).ok());
  EXPECT_TRUE(SameBytes(a.data(), tied_.bytes.data(), a.size()));
  EXPECT_TRUE(SameBytes(b.data(), tied_.bytes.data(), b.size()));
}

TEST_F(TiedReadTest, DifferentValuesIntoOneMemoryAreRefused) {
  std::unique_ptr<Reader> reader = Open();
  ASSERT_NE(reader, nullptr);
  std::vector<uint8_t> storage(tied_.bytes.size(), 0xab);
  std::vector<ReadTarget> targets = {{"embed.w", storage.data(), storage.size()},
                                     {"other.w", storage.data(), storage.size()}};
  absl::Status status = reader->ReadInto(targets);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "\"other.w\"")) << status;
  EXPECT_EQ(storage[0], 0xab) << "refused before anything is read";
}

}  // namespace
}  // namespace ckpt
