// Hostile and broken checkpoint directories: what someone who can write into
// ROOT (or a buggy tool) can plant there. Manifests are rewritten with a
// correct checksum, as an attacker would, so that the bounds checks behind
// the checksum are what is tested. Each case must be refused with a clear
// error before any large allocation, any blocking open or any access outside
// ROOT; the newest good checkpoint stays readable.
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ckpt/catalog.h"
#include "ckpt/engine.h"
#include "ckpt/reader.h"
#include "format/names.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace ckpt {
namespace {

using Json = nlohmann::ordered_json;
using testing::OwnedTensor;
using testing::RandomTensor;
using testing::ReadText;
using testing::ScratchDir;
using testing::WriteText;
using testing::Views;

constexpr char kTrailerHead[] = ",\n \"manifest_xxh3\": \"";

// Every entry under `dir` (recursively) with its size: what must not change.
std::map<std::string, uintmax_t> Listing(const std::string& dir) {
  std::map<std::string, uintmax_t> out;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    out[e.path().string()] = e.is_regular_file() ? e.file_size() : 0;
  }
  return out;
}

class HostileCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = dir_.Join("root");
    outside_ = outside_dir_.path();
    WriteText(outside_dir_.Join("victim"), "precious\n");
    Rebuild();
    outside_before_ = Listing(outside_);
  }

  // A fresh ROOT with two good full checkpoints, steps 1 and 2.
  void Rebuild() {
    testing::RemoveTree(root_);
    auto engine = Engine::Open(root_, EngineOptions{});
    ASSERT_TRUE(engine.ok()) << engine.status();
    for (int64_t step : {1, 2}) {
      state_.clear();
      state_.push_back(RandomTensor("layers.0.w", DType::kFloat32, {256, 64}, 10 * step));
      state_.push_back(RandomTensor("layers.0.b", DType::kFloat32, {64}, 10 * step + 1));
      state_.push_back(RandomTensor("layers.0.scale", DType::kBFloat16, {64}, 10 * step + 2));
      ASSERT_TRUE((*engine)->Save(step, Views(state_)).ok());
      if (step == 1) step1_ = state_;
    }
    ASSERT_TRUE((*engine)->Close().ok());
  }

  void TearDown() override {
    EXPECT_EQ(Listing(outside_), outside_before_) << "something outside ROOT changed";
    EXPECT_EQ(ReadText(outside_dir_.Join("victim")), "precious\n");
  }

  std::string StepDir(int64_t step) const { return absl::StrCat(root_, "/", StepDirName(step)); }
  std::string ManifestPath(int64_t step) const { return StepDir(step) + "/MANIFEST.json"; }

  // Rewrites step `step`'s manifest through `edit`, with a valid checksum.
  void EditManifest(int64_t step, const std::function<void(Json&)>& edit) {
    const std::string text = ReadText(ManifestPath(step));
    const size_t trailer = text.rfind(kTrailerHead);
    ASSERT_NE(trailer, std::string::npos);
    Json j = Json::parse(text.substr(0, trailer) + "\n}");
    edit(j);
    std::string body = j.dump(1);
    body.resize(body.size() - 2);  // "\n}"
    const uint64_t hash = XXH3_64bits(body.data(), body.size());
    WriteText(ManifestPath(step), absl::StrCat(body, kTrailerHead, absl::StrFormat("%016x", hash), "\"\n}\n"));
  }

  std::string FirstShard(int64_t step) {
    Json j = Json::parse(ReadText(ManifestPath(step)));
    return j["shards"][0]["file"].get<std::string>();
  }

  // Opens step `step` (newest when nullopt) and verifies every record.
  absl::StatusOr<int64_t> OpenAndVerify(std::optional<int64_t> step) {
    absl::StatusOr<int64_t> result = absl::UnknownError("not run");
    testing::RunOrDie(
        [&] {
          ReaderOptions options;
          options.step = step;
          auto reader = Reader::Open(root_, options);
          if (!reader.ok()) {
            result = reader.status();
            return;
          }
          absl::Status verified = (*reader)->Verify();
          result = verified.ok() ? absl::StatusOr<int64_t>((*reader)->step()) : verified;
        },
        absl::Seconds(30), "open and verify a hostile checkpoint");
    return result;
  }

  // Step 2 is refused with `code` and a message containing `words`; the
  // newest readable checkpoint is then step 1, with step 1's values.
  void ExpectRefused(absl::StatusCode code, const std::string& words) {
    absl::StatusOr<int64_t> two = OpenAndVerify(2);
    ASSERT_FALSE(two.ok()) << "step 2 was accepted";
    EXPECT_EQ(two.status().code(), code) << two.status();
    EXPECT_NE(two.status().message().find(words), std::string::npos) << two.status();
    absl::StatusOr<int64_t> newest = OpenAndVerify(std::nullopt);
    ASSERT_TRUE(newest.ok()) << newest.status();
    EXPECT_EQ(*newest, 1);
    testing::ExpectCheckpointEquals(root_, 1, step1_);
  }

  ScratchDir dir_;
  ScratchDir outside_dir_{"ckpt-outside"};
  std::string root_;
  std::string outside_;
  std::map<std::string, uintmax_t> outside_before_;
  std::vector<OwnedTensor> state_, step1_;
};

TEST_F(HostileCheckpointTest, ShardNamesLeavingTheDirectoryAreRefused) {
  const std::string shard = FirstShard(2);
  for (const std::string& evil : {std::string("../../victim"), outside_ + "/victim", std::string("a/b"),
                                  std::string(".hidden"), std::string("MANIFEST.json")}) {
    SCOPED_TRACE(evil);
    Rebuild();  // a fresh step 2 each time
    EditManifest(2, [&](Json& j) {
      j["shards"][0]["file"] = evil;
      for (Json& t : j["tensors"]) {
        if (t["shard"] == shard) t["shard"] = evil;
      }
    });
    ExpectRefused(absl::StatusCode::kDataLoss, "not a plain file name");
  }
}

TEST_F(HostileCheckpointTest, AShardReplacedByASymlinkIsNotFollowed) {
  // The link points at a byte-identical copy: only refusing the link itself
  // keeps the reader inside ROOT.
  const std::string shard = StepDir(2) + "/" + FirstShard(2);
  const std::string copy = outside_ + "/copy.shard";
  std::filesystem::copy_file(shard, copy);
  outside_before_ = Listing(outside_);
  std::filesystem::remove(shard);
  std::filesystem::create_symlink(copy, shard);
  ExpectRefused(absl::StatusCode::kDataLoss, "symbolic link");
}

TEST_F(HostileCheckpointTest, AShardReplacedByAFifoDoesNotHangTheReader) {
  const std::string shard = StepDir(2) + "/" + FirstShard(2);
  std::filesystem::remove(shard);
  ASSERT_EQ(::mkfifo(shard.c_str(), 0600), 0);
  ExpectRefused(absl::StatusCode::kDataLoss, FirstShard(2));
}

TEST_F(HostileCheckpointTest, AShardReplacedByADirectoryIsRefused) {
  const std::string shard = StepDir(2) + "/" + FirstShard(2);
  std::filesystem::remove(shard);
  std::filesystem::create_directory(shard);
  ExpectRefused(absl::StatusCode::kDataLoss, "directory");
}

TEST_F(HostileCheckpointTest, AManifestReplacedByAFifoDoesNotHangTheReader) {
  std::filesystem::remove(ManifestPath(2));
  ASSERT_EQ(::mkfifo(ManifestPath(2).c_str(), 0600), 0);
  ExpectRefused(absl::StatusCode::kDataLoss, "FIFO");
}

TEST_F(HostileCheckpointTest, AStepDirectoryThatIsASymlinkIsRefused) {
  // step-2 now points outside ROOT, at a complete, valid checkpoint.
  const std::string moved = outside_ + "/" + StepDirName(2);
  std::filesystem::rename(StepDir(2), moved);
  outside_before_ = Listing(outside_);
  std::filesystem::create_directory_symlink(moved, StepDir(2));
  ExpectRefused(absl::StatusCode::kDataLoss, "symbolic link");
}

TEST_F(HostileCheckpointTest, HugeShapesAreRefusedBeforeAnyAllocation) {
  // Element counts that overflow, and a consistent 4 TB tensor whose record
  // cannot fit its shard: both fail in the manifest checks.
  EditManifest(2, [](Json& j) { j["tensors"][0]["shape"] = {int64_t{1} << 40, int64_t{1} << 40}; });
  ExpectRefused(absl::StatusCode::kDataLoss, "layers.0.w");
  Rebuild();
  EditManifest(2, [](Json& j) {
    j["tensors"][0]["shape"] = {int64_t{1} << 20, int64_t{1} << 20};
    j["tensors"][0]["raw_bytes"] = uint64_t{4} << 40;
    j["tensors"][0]["stored_bytes"] = uint64_t{4} << 40;
  });
  ExpectRefused(absl::StatusCode::kDataLoss, "layers.0.w");
  Rebuild();
  EditManifest(2, [](Json& j) {
    j["tensors"][0]["shape"] = Json::array();
    for (int i = 0; i < 100; ++i) j["tensors"][0]["shape"].push_back(1);
  });
  ExpectRefused(absl::StatusCode::kDataLoss, "layers.0.w");
}

TEST_F(HostileCheckpointTest, ASmallCompressedRecordClaimingAHugeTensorIsRefused) {
  EditManifest(2, [](Json& j) {
    j["tensors"][1]["encoding"] = "zstd";
    j["tensors"][1]["shape"] = {int64_t{1} << 30};
    j["tensors"][1]["raw_bytes"] = uint64_t{4} << 30;  // 4 GiB from a 4 KiB record
    j["tensors"][1]["stored_bytes"] = 4096;
  });
  ExpectRefused(absl::StatusCode::kDataLoss, "cannot hold raw_bytes");
}

TEST_F(HostileCheckpointTest, MalformedStoredChecksumsAreRefused) {
  for (const Json& bad : {Json("not a checksum"), Json(12345), Json("0123456789ABCDEF")}) {
    SCOPED_TRACE(bad.dump());
    Rebuild();
    EditManifest(2, [&](Json& j) { j["tensors"][0]["stored_xxh3"] = bad; });
    ExpectRefused(absl::StatusCode::kDataLoss, "stored_xxh3");
  }
}

TEST_F(HostileCheckpointTest, ChunkPlacesAndBlockHashesThatDoNotFitAreRefused) {
  // A chunk reaching past its global tensor.
  EditManifest(2, [](Json& j) {
    Json& t = j["tensors"][0];
    t["placement"] = "sharded";
    t["global_shape"] = t["shape"];
    t["global_offset"] = Json::array();
    for (size_t d = 0; d < t["shape"].size(); ++d) t["global_offset"].push_back(d == 0 ? 1 : 0);
  });
  ExpectRefused(absl::StatusCode::kDataLoss, "reaches past the global tensor");
  Rebuild();
  // Block hashes that do not cover the record.
  EditManifest(2, [](Json& j) {
    j["tensors"][0]["block_bytes"] = 4096;
    j["tensors"][0]["block_xxh3"] = Json::array();
  });
  ExpectRefused(absl::StatusCode::kDataLoss, "block_xxh3 is not an array of");
  Rebuild();
  // Block hashes that fit but are wrong: the whole record's hash still
  // matches, and verification still fails, naming the block.
  EditManifest(2, [](Json& j) {
    Json& t = j["tensors"][0];
    t["block_bytes"] = 4096;
    t["block_xxh3"] = Json::array();
    for (uint64_t at = 0; at < t["raw_bytes"].get<uint64_t>(); at += 4096) t["block_xxh3"].push_back("0000000000000001");
  });
  absl::StatusOr<int64_t> verified = OpenAndVerify(2);
  EXPECT_EQ(verified.status().code(), absl::StatusCode::kDataLoss) << verified.status();
  EXPECT_TRUE(absl::StrContains(verified.status().message(), "layers.0.w (block 0)")) << verified.status();
}

TEST_F(HostileCheckpointTest, OverlappingRecordsAreRefused) {
  // Two tensors of one shard made to read the same bytes.
  EditManifest(2, [](Json& j) {
    Json& a = j["tensors"][1];
    Json& b = j["tensors"][2];
    b["shard"] = a["shard"];
    b["offset"] = a["offset"];
  });
  ExpectRefused(absl::StatusCode::kDataLoss, "overlap");
}

TEST_F(HostileCheckpointTest, SelfReferencingAndForwardDeltaBasesAreRefused) {
  for (int64_t base : {2, 3, -1}) {
    SCOPED_TRACE(base);
    Rebuild();
    EditManifest(2, [&](Json& j) {
      j["kind"] = "delta";
      j["delta_mode"] = "exact";
      j["base"] = {{"step", base}, {"manifest_xxh3", "0123456789abcdef"}};
    });
    ExpectRefused(absl::StatusCode::kDataLoss, "base");
  }
}

TEST_F(HostileCheckpointTest, ANewerFormatVersionIsRefusedAsUnsupported) {
  // (2 is a multi-rank checkpoint's step manifest, see distributed_engine_test.)
  EditManifest(2, [](Json& j) { j["format_version"] = 3; });
  absl::StatusOr<int64_t> two = OpenAndVerify(2);
  ASSERT_FALSE(two.ok());
  EXPECT_EQ(two.status().code(), absl::StatusCode::kUnimplemented) << two.status();
  EXPECT_NE(two.status().message().find("format version"), std::string::npos) << two.status();
}

TEST_F(HostileCheckpointTest, LatestNamingAPathOutsideRootIsOnlyAHint) {
  for (const std::string& evil : {std::string("../../victim\n"), outside_ + "\n",
                                  std::string("step-1/../../x\n")}) {
    WriteText(root_ + "/LATEST", evil);
    auto hint = ReadLatestHint(root_);
    EXPECT_TRUE(!hint.ok() || !hint->has_value()) << evil;
    absl::StatusOr<int64_t> newest = OpenAndVerify(std::nullopt);
    ASSERT_TRUE(newest.ok()) << newest.status();
    EXPECT_EQ(*newest, 2);
  }
  std::filesystem::remove(root_ + "/LATEST");
  std::filesystem::create_symlink(outside_ + "/victim", root_ + "/LATEST");
  auto hint = ReadLatestHint(root_);
  ASSERT_FALSE(hint.ok());
  EXPECT_NE(hint.status().message().find("symbolic link"), std::string::npos) << hint.status();
  absl::StatusOr<int64_t> newest = OpenAndVerify(std::nullopt);
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_EQ(*newest, 2);
}

// Found by fuzz_names: 20 digits can exceed 2^64, and the parser used to
// wrap, so "step-40000080000000000000" was taken for step 3106511852580896768.
TEST(CheckpointDirNameTest, StepsBeyondInt64AreNotSteps) {
  using internal::ParseCheckpointDirName;
  EXPECT_EQ(ParseCheckpointDirName("step-40000080000000000000"), std::nullopt);
  EXPECT_EQ(ParseCheckpointDirName("step-99999999999999999999"), std::nullopt);
  EXPECT_EQ(ParseCheckpointDirName("step-09223372036854775808"), std::nullopt);
  EXPECT_EQ(ParseCheckpointDirName("step-09223372036854775807"), std::optional<int64_t>(INT64_MAX));
  EXPECT_EQ(ParseCheckpointDirName("step-00000000000000001200"), std::optional<int64_t>(1200));
}

TEST_F(HostileCheckpointTest, ADirectoryNamedBeyondInt64IsIgnored) {
  std::filesystem::copy(StepDir(1), root_ + "/step-40000080000000000000");
  auto steps = ListSteps(root_);
  ASSERT_TRUE(steps.ok()) << steps.status();
  EXPECT_EQ(*steps, (std::vector<int64_t>{1, 2}));
  absl::StatusOr<int64_t> newest = OpenAndVerify(std::nullopt);
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_EQ(*newest, 2);
}

TEST_F(HostileCheckpointTest, CheckpointFilesGetRestrictiveModes) {
  const mode_t mask = ::umask(0);
  ::umask(mask);
  struct stat st;
  ASSERT_EQ(::stat(StepDir(2).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0750 & ~mask) << std::oct << st.st_mode;
  for (const auto& e : std::filesystem::directory_iterator(StepDir(2))) {
    ASSERT_EQ(::stat(e.path().c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0640 & ~mask) << e.path() << " " << std::oct << st.st_mode;
  }
  ASSERT_EQ(::stat((root_ + "/LATEST").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640 & ~mask) << std::oct << st.st_mode;
}

}  // namespace
}  // namespace ckpt
