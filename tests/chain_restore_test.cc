// Restoring long delta chains in bulk (read/apply_chains.h): chains of up to
// 11 links of mixed encodings restore bit-exactly through every read path;
// damage to one link's stored bytes, or a manifest's wrong `stored_xxh3`, is
// kDataLoss naming that link; a link whose stored bytes match but whose
// value does not is found by the link-by-link re-check; checkpoints written
// before `stored_xxh3` existed still restore.
#include <xxhash.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ckpt/catalog.h"
#include "ckpt/engine.h"
#include "ckpt/reader.h"
#include "delta/delta_codec.h"
#include "format/names.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace ckpt {
namespace {

using Json = nlohmann::ordered_json;
using testing::OwnedTensor;
using testing::RandomTensor;
using testing::ReadText;
using testing::SameBytes;
using testing::ScratchDir;
using testing::WriteText;

constexpr int kSaves = 11;
constexpr char kTrailerHead[] = ",\n \"manifest_xxh3\": \"";

// Floats near 1 (byte planes compress them), `n` of them.
OwnedTensor SmoothTensor(const std::string& name, size_t n, uint64_t seed) {
  OwnedTensor t{name, DType::kFloat32, {static_cast<int64_t>(n)}, std::vector<uint8_t>(n * 4)};
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(1.0f, 0.05f);
  for (size_t i = 0; i < n; ++i) {
    const float f = d(rng);
    std::memcpy(t.bytes.data() + 4 * i, &f, 4);
  }
  return t;
}

// Moves every element of an fp32 tensor a little (every low mantissa byte
// changes, as under AdamW).
void NudgeAll(OwnedTensor& t, std::mt19937_64& rng) {
  std::normal_distribution<float> d(0.0f, 1e-4f);
  for (size_t i = 0; i + 4 <= t.bytes.size(); i += 4) {
    float f;
    std::memcpy(&f, t.bytes.data() + i, 4);
    f += d(rng);
    std::memcpy(t.bytes.data() + i, &f, 4);
  }
}

// Changes `fraction` of the elements to random bits.
void Scatter(OwnedTensor& t, double fraction, std::mt19937_64& rng) {
  const size_t elem = DTypeSize(t.dtype);
  const size_t n = t.bytes.size() / elem;
  for (size_t c = 0; c < static_cast<size_t>(fraction * n); ++c) {
    const size_t i = rng() % n;
    for (size_t b = 0; b < elem; ++b) t.bytes[i * elem + b] = static_cast<uint8_t>(rng());
  }
}

std::vector<TensorView> ViewsOf(const std::vector<OwnedTensor>& tensors) { return testing::Views(tensors); }

// Saves `kSaves` steps (a full one, then chained exact deltas) of a state
// whose tensors change in every way a chain meets: dense (xor_planes), a
// little (sparse), partly (xor / 1-byte dtypes), not at all, wholly (stored
// whole mid-chain), added late, removed early, and empty.
class ChainRestoreTest : public ::testing::TestWithParam<CompressionCodec> {
 protected:
  void SetUp() override {
    root_ = dir_.Join("root");
    EngineOptions options = testing::SmallChunks();
    options.delta.mode = DeltaOptions::Mode::kExact;
    options.delta.base = DeltaOptions::Base::kChained;
    options.delta.full_every = kSaves;
    options.delta.max_restore_read_factor = 0;
    options.compression.codec = GetParam();
    options.compression.adaptive = false;
    auto engine = Engine::Open(root_, options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    std::mt19937_64 rng(11);
    std::vector<OwnedTensor> state = {
        SmoothTensor("dense.w", 5 << 18, 1),  // 5 MiB: its blocks may decode on the pool
        SmoothTensor("dense.m", 20000, 2),
        RandomTensor("sparse.w", DType::kFloat32, {20000}, 3),
        RandomTensor("half.b", DType::kBFloat16, {4096}, 4),
        RandomTensor("bytes.mask", DType::kUInt8, {30000}, 5),
        RandomTensor("still.w", DType::kFloat32, {1000}, 6),
        RandomTensor("reset.w", DType::kFloat32, {5000}, 7),
        RandomTensor("gone.w", DType::kFloat32, {3000}, 8),
        OwnedTensor{"empty", DType::kFloat32, {0}, {}},
    };
    for (int step = 1; step <= kSaves; ++step) {
      if (step > 1) {
        for (OwnedTensor& t : state) {
          if (t.name == "dense.w" || t.name == "dense.m") NudgeAll(t, rng);
          if (t.name == "sparse.w") Scatter(t, 0.01, rng);
          if (t.name == "half.b" || t.name == "late.w") Scatter(t, 0.2, rng);
          if (t.name == "bytes.mask") Scatter(t, 0.7, rng);  // dense, 1-byte: xor
          if (t.name == "reset.w" && step == 6) Scatter(t, 4.0, rng);  // whole again at step 6
        }
      }
      if (step == 4) state.push_back(RandomTensor("late.w", DType::kFloat32, {7000}, 9));
      if (step == 7) std::erase_if(state, [](const OwnedTensor& t) { return t.name == "gone.w"; });
      auto stats = (*engine)->Save(step, ViewsOf(state));
      ASSERT_TRUE(stats.ok()) << stats.status();
      ASSERT_EQ(stats->kind, step == 1 ? CheckpointKind::kFull : CheckpointKind::kDelta) << step;
      history_.push_back(state);
    }
    ASSERT_TRUE((*engine)->Close().ok());
  }

  std::string StepDir(int64_t step) const { return absl::StrCat(root_, "/", StepDirName(step)); }
  std::string ManifestPath(int64_t step) const { return StepDir(step) + "/MANIFEST.json"; }

  Json Manifest(int64_t step) const {
    const std::string text = ReadText(ManifestPath(step));
    return Json::parse(text.substr(0, text.rfind(kTrailerHead)) + "\n}");
  }
  // Rewrites step `step`'s manifest through `edit`, with a valid checksum.
  void EditManifest(int64_t step, const std::function<void(Json&)>& edit) {
    Json j = Manifest(step);
    edit(j);
    std::string body = j.dump(1);
    body.resize(body.size() - 2);  // "\n}"
    const uint64_t hash = XXH3_64bits(body.data(), body.size());
    WriteText(ManifestPath(step), absl::StrCat(body, kTrailerHead, absl::StrFormat("%016x", hash), "\"\n}\n"));
  }
  // Steps after `step` name their base's manifest checksum anew, as a writer
  // would have after `step`'s manifest was edited.
  void RechainAfter(int64_t step) {
    for (int64_t s = step + 1; s <= kSaves; ++s) {
      const std::string text = ReadText(ManifestPath(s - 1));
      const std::string hex = text.substr(text.rfind(kTrailerHead) + std::strlen(kTrailerHead), 16);
      EditManifest(s, [&](Json& j) { j["base"]["manifest_xxh3"] = hex; });
    }
  }
  // Step `step`'s manifest entry of tensor `name`.
  Json Entry(int64_t step, const std::string& name) const {
    const Json manifest = Manifest(step);
    for (const Json& t : manifest["tensors"]) {
      if (t["name"] == name) return t;
    }
    ADD_FAILURE() << "no " << name << " in step " << step;
    return Json();
  }
  void FlipStoredByte(int64_t step, const std::string& name, uint64_t at) {
    const Json t = Entry(step, name);
    ASSERT_LT(at, t["stored_bytes"].get<uint64_t>());
    std::fstream f(StepDir(step) + "/" + t["shard"].get<std::string>(),
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(t["offset"].get<uint64_t>() + at);
    const char c = static_cast<char>(f.get());
    f.seekp(t["offset"].get<uint64_t>() + at);
    f.put(static_cast<char>(c ^ 0x5a));
  }

  // Reads step `step` back (`ReadAll` and `Verify`; with `every_way`,
  // `Read` and `ReadInto` too) and expects exactly what was saved.
  void ExpectStepRestores(int64_t step, size_t buffer_bytes, bool every_way = true) {
    SCOPED_TRACE(absl::StrCat("step ", step, ", buffer_bytes ", buffer_bytes));
    const std::vector<OwnedTensor>& want = history_[step - 1];
    ReaderOptions options;
    options.step = step;
    options.io.buffer_bytes = buffer_bytes;
    auto reader = Reader::Open(root_, options);
    ASSERT_TRUE(reader.ok()) << reader.status();
    ASSERT_EQ((*reader)->tensors().size(), want.size());
    auto all = (*reader)->ReadAll();
    ASSERT_TRUE(all.ok()) << all.status();
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ((*all)[i].name, want[i].name);
      ASSERT_EQ((*all)[i].nbytes(), want[i].bytes.size());
      EXPECT_TRUE(SameBytes((*all)[i].data(), want[i].bytes.data(), want[i].bytes.size())) << want[i].name;
    }
    EXPECT_TRUE((*reader)->Verify().ok());
    if (!every_way) return;
    // One at a time, and all into caller memory (unaligned, in reverse).
    for (const OwnedTensor& t : want) {
      auto one = (*reader)->Read(t.name);
      ASSERT_TRUE(one.ok()) << one.status();
      EXPECT_TRUE(SameBytes(one->data(), t.bytes.data(), t.bytes.size())) << t.name;
    }
    std::vector<std::vector<uint8_t>> into;
    std::vector<ReadTarget> targets;
    for (size_t i = want.size(); i > 0; --i) into.emplace_back(want[i - 1].bytes.size() + 1);
    for (size_t i = want.size(); i > 0; --i) {
      std::vector<uint8_t>& buf = into[want.size() - i];
      targets.push_back(ReadTarget{want[i - 1].name, buf.data() + 1, buf.size() - 1});
    }
    ASSERT_TRUE((*reader)->ReadInto(targets).ok());
    for (size_t i = want.size(); i > 0; --i) {
      EXPECT_TRUE(SameBytes(into[want.size() - i].data() + 1, want[i - 1].bytes.data(),
                            want[i - 1].bytes.size()))
          << want[i - 1].name;
    }
  }

  absl::Status ReadAllAt(int64_t step) {
    ReaderOptions options;
    options.step = step;
    auto reader = Reader::Open(root_, options);
    if (!reader.ok()) return reader.status();
    return (*reader)->ReadAll().status();
  }
  absl::Status VerifyAt(int64_t step) {
    ReaderOptions options;
    options.step = step;
    auto reader = Reader::Open(root_, options);
    if (!reader.ok()) return reader.status();
    return (*reader)->Verify();
  }

  ScratchDir dir_;
  std::string root_;
  std::vector<std::vector<OwnedTensor>> history_;  // by step - 1
};

INSTANTIATE_TEST_SUITE_P(Bases, ChainRestoreTest,
                         ::testing::Values(CompressionCodec::kNone, CompressionCodec::kZstd,
                                           CompressionCodec::kPlanes),
                         [](const auto& info) {
                           return std::string(info.param == CompressionCodec::kNone   ? "raw"
                                              : info.param == CompressionCodec::kZstd ? "zstd"
                                                                                      : "planes");
                         });

TEST_P(ChainRestoreTest, EveryStepOfAnElevenLinkChainRestoresBitExactly) {
  // The chain holds every delta encoding, each with its stored checksum.
  std::set<std::string> encodings;
  for (int64_t step = 2; step <= kSaves; ++step) {
    const Json manifest = Manifest(step);
    for (const Json& t : manifest["tensors"]) {
      const std::string e = t["encoding"];
      encodings.insert(e);
      if (e == "sparse" || e == "xor" || e == "xor_planes") EXPECT_TRUE(t.contains("stored_xxh3")) << t;
    }
  }
  for (const char* e : {"sparse", "xor", "xor_planes", "raw"}) EXPECT_TRUE(encodings.count(e)) << e;
  // The full step's records are whole as the codec stores them.
  std::set<std::string> bases;
  const Json full = Manifest(1);
  for (const Json& t : full["tensors"]) bases.insert(t["encoding"].get<std::string>());
  if (GetParam() == CompressionCodec::kZstd) EXPECT_TRUE(bases.count("zstd"));
  if (GetParam() == CompressionCodec::kPlanes) EXPECT_TRUE(bases.count("planes"));
  for (int64_t step = 1; step <= kSaves; ++step) {
    ExpectStepRestores(step, size_t{64} << 20, /*every_way=*/step == 2 || step == 7 || step == kSaves);
  }
  // Batches of one link at a time (the arena's two-batch placement).
  ExpectStepRestores(kSaves, 64 << 10);
  ExpectStepRestores(7, 4096);
}

TEST_P(ChainRestoreTest, ADamagedLinkIsDataLossNamingItsStep) {
  FlipStoredByte(5, "dense.w", 100);
  for (absl::Status s : {ReadAllAt(kSaves), VerifyAt(kSaves)}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_NE(s.message().find(StepDirName(5)), std::string::npos) << s;
    EXPECT_NE(s.message().find(Entry(5, "dense.w")["shard"].get<std::string>()), std::string::npos) << s;
    EXPECT_NE(s.message().find("stored_xxh3"), std::string::npos) << s;
  }
  ExpectStepRestores(4, size_t{64} << 20);  // the steps before it are whole
}

// The bases are read by the chain pipeline between batches of links: a
// damaged base of a tensor whose links come in a later batch is kDataLoss
// naming the full step and the tensor, with small and large arenas.
TEST_P(ChainRestoreTest, ADamagedBaseReadBetweenBatchesIsDataLossNamingIt) {
  FlipStoredByte(1, "bytes.mask", 7);
  for (size_t buffer_bytes : {size_t{64} << 10, size_t{64} << 20}) {
    ReaderOptions options;
    options.step = kSaves;
    options.io.buffer_bytes = buffer_bytes;
    auto reader = Reader::Open(root_, options);
    ASSERT_TRUE(reader.ok()) << reader.status();
    absl::Status s = (*reader)->ReadAll().status();
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << buffer_bytes << ": " << s;
    EXPECT_NE(s.message().find(StepDirName(1)), std::string::npos) << s;
    EXPECT_NE(s.message().find("bytes.mask"), std::string::npos) << s;
    // The same reader still reads what the damage does not touch.
    auto dense = (*reader)->Read("dense.w");
    ASSERT_TRUE(dense.ok()) << dense.status();
    EXPECT_TRUE(SameBytes(dense->data(), history_[kSaves - 1][0].bytes.data(), dense->nbytes()));
  }
}

TEST_P(ChainRestoreTest, AWrongStoredChecksumIsNamed) {
  EditManifest(8, [](Json& j) {
    for (Json& t : j["tensors"]) {
      if (t["name"] == "sparse.w") t["stored_xxh3"] = "0123456789abcdef";
    }
  });
  RechainAfter(8);
  absl::Status s = ReadAllAt(kSaves);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("\"sparse.w\""), std::string::npos) << s;
  EXPECT_NE(s.message().find(StepDirName(8)), std::string::npos) << s;
  EXPECT_NE(s.message().find("0123456789abcdef"), std::string::npos) << s;
}

TEST_P(ChainRestoreTest, ALinkWhoseValueIsWrongIsFoundLinkByLink) {
  // Step 6's delta of "sparse.w" replaced by a valid, checksummed one of
  // another change: every stored checksum matches, the restored value does
  // not, and the link-by-link re-check names step 6.
  const Json t = Entry(6, "sparse.w");
  const size_t n = t["raw_bytes"].get<size_t>();
  std::vector<char> r(n, 0), x(n, 0);
  x[0] = 1;
  internal::Piece piece{x.data(), n};
  auto delta = internal::EncodeExactDelta({&piece, 1}, r.data(), n, DType::kFloat32, 1);
  ASSERT_TRUE(delta.ok()) << delta.status();
  ASSERT_LE(delta->bytes.size(), t["stored_bytes"].get<size_t>());
  {
    std::fstream f(StepDir(6) + "/" + t["shard"].get<std::string>(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(t["offset"].get<uint64_t>());
    f.write(delta->bytes.data(), delta->bytes.size());
  }
  EditManifest(6, [&](Json& j) {
    for (Json& e : j["tensors"]) {
      if (e["name"] != "sparse.w") continue;
      e["encoding"] = std::string(RecordEncodingName(delta->encoding));
      e["stored_bytes"] = delta->bytes.size();
      e["stored_xxh3"] = absl::StrFormat("%016x", XXH3_64bits(delta->bytes.data(), delta->bytes.size()));
    }
  });
  RechainAfter(6);
  absl::Status s = ReadAllAt(kSaves);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("\"sparse.w\""), std::string::npos) << s;
  EXPECT_NE(s.message().find(StepDirName(6)), std::string::npos) << s;
  EXPECT_NE(s.message().find("checksum mismatch"), std::string::npos) << s;
}

TEST_P(ChainRestoreTest, CheckpointsWithoutStoredChecksumsRestoreAndNameDamage) {
  // As a writer before `stored_xxh3` wrote them.
  for (int64_t step = 1; step <= kSaves; ++step) {
    EditManifest(step, [](Json& j) {
      for (Json& t : j["tensors"]) t.erase("stored_xxh3");
    });
  }
  RechainAfter(1);
  ReaderOptions options;
  auto reader = Reader::Open(root_, options);
  ASSERT_TRUE(reader.ok()) << reader.status();
  for (const TensorInfo& t : (*reader)->tensors()) EXPECT_FALSE(t.stored_xxh3.has_value()) << t.name;
  for (int64_t step : {2, 6, kSaves}) ExpectStepRestores(step, size_t{64} << 20, /*every_way=*/false);
  FlipStoredByte(5, "dense.w", 100);
  absl::Status s = ReadAllAt(kSaves);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find(StepDirName(5)), std::string::npos) << s;
}

}  // namespace
}  // namespace ckpt
