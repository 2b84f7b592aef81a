// Full saves with byte-plane compression (CompressionCodec::kPlanes): every
// dtype and special value restores bit-exactly through Read, ReadInto and
// Verify, with the adaptive rule on and off, alone and under deltas; float
// state shrinks, and damage is named.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>

#include "ckpt/engine.h"
#include "ckpt/reader.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace ckpt {
namespace {

using testing::ExpectCheckpointEquals;
using testing::OwnedTensor;
using testing::RandomTensor;
using testing::ScratchDir;
using testing::Views;

EngineOptions Planes(bool adaptive) {
  EngineOptions options = testing::SmallChunks();
  options.compression.codec = CompressionCodec::kPlanes;
  options.compression.adaptive = adaptive;
  return options;
}

// Weights ~N(0, 0.02) with NaN payloads, -0.0, infinities and denormals.
OwnedTensor Weights(const std::string& name, DType dtype, int64_t n, uint64_t seed) {
  OwnedTensor t{name, dtype, {n}, std::vector<uint8_t>(n * DTypeSize(dtype))};
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (int64_t i = 0; i < n; ++i) {
    float v = normal(rng);
    if (i % 997 == 1) v = std::bit_cast<float>(0x7FC00000u | static_cast<uint32_t>(i));
    if (i % 997 == 2) v = -0.0f;
    if (i % 997 == 3) v = std::numeric_limits<float>::infinity();
    if (i % 997 == 4) v = std::numeric_limits<float>::denorm_min();
    uint8_t* p = t.bytes.data() + i * DTypeSize(dtype);
    switch (dtype) {
      case DType::kFloat32: std::memcpy(p, &v, 4); break;
      case DType::kFloat64: { const double d = v; std::memcpy(p, &d, 8); break; }
      case DType::kBFloat16: { const uint16_t b = std::bit_cast<uint32_t>(v) >> 16; std::memcpy(p, &b, 2); break; }
      default: p[0] = static_cast<uint8_t>(rng()); break;
    }
  }
  return t;
}

std::vector<OwnedTensor> State() {
  std::vector<OwnedTensor> state;
  uint64_t seed = 1;
  for (int d = 0; d < kNumDTypes; ++d) {
    const DType dtype = static_cast<DType>(d);
    state.push_back(RandomTensor("rand." + std::string(DTypeName(dtype)), dtype, {3001}, seed++));
  }
  state.push_back(Weights("w.f32", DType::kFloat32, 300000, seed++));  // several chunks
  state.push_back(Weights("w.bf16", DType::kBFloat16, 200001, seed++));
  state.push_back(Weights("w.f64", DType::kFloat64, 50000, seed++));
  state.push_back(OwnedTensor{"zeros", DType::kFloat32, {70000}, std::vector<uint8_t>(280000)});
  state.push_back(RandomTensor("empty", DType::kFloat32, {0}, seed++));
  return state;
}

class PlanesCompressionTest : public ::testing::TestWithParam<bool> {};

TEST_P(PlanesCompressionTest, EveryDTypeRestoresBitExactly) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  auto engine = Engine::Open(root, Planes(GetParam()));
  ASSERT_TRUE(engine.ok()) << engine.status();
  const std::vector<OwnedTensor> state = State();
  auto stats = (*engine)->Save(1, Views(state));
  ASSERT_TRUE(stats.ok()) << stats.status();
  ExpectCheckpointEquals(root, 1, state);
  if (!GetParam()) {
    // Every block compressed: the float weights and zeros shrink.
    auto reader = Reader::Open(root, {});
    ASSERT_TRUE(reader.ok());
    for (const char* name : {"w.f32", "w.bf16", "zeros"}) {
      const TensorInfo* t = (*reader)->Find(name);
      ASSERT_NE(t, nullptr);
      EXPECT_EQ(t->encoding, RecordEncoding::kPlanes) << name;
      EXPECT_LT(t->stored_bytes, 0.9 * t->raw_bytes) << name;
    }
    EXPECT_LT((*reader)->Find("zeros")->stored_bytes, 1000u);
  }
}

TEST_P(PlanesCompressionTest, UnderDeltasFullSavesAreCompressed) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  EngineOptions options = Planes(GetParam());
  options.delta.mode = DeltaOptions::Mode::kExact;
  options.delta.full_every = 3;
  auto engine = Engine::Open(root, options);
  ASSERT_TRUE(engine.ok());
  std::vector<OwnedTensor> state = State();
  std::vector<std::vector<OwnedTensor>> saved;
  std::mt19937_64 rng(3);
  for (int step = 0; step < 5; ++step) {
    for (OwnedTensor& t : state) {
      for (size_t i = 0; i < t.bytes.size(); i += 7) t.bytes[i] ^= static_cast<uint8_t>(rng() & 1);
      if (t.dtype == DType::kBool) for (auto& b : t.bytes) b &= 1;
    }
    auto stats = (*engine)->Save(step, Views(state));
    ASSERT_TRUE(stats.ok()) << stats.status();
    saved.push_back(state);
  }
  ASSERT_TRUE((*engine)->Close().ok());
  for (int step = 0; step < 5; ++step) ExpectCheckpointEquals(root, step, saved[step]);
}

TEST_P(PlanesCompressionTest, DamageIsNamed) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  {
    auto engine = Engine::Open(root, Planes(false));
    ASSERT_TRUE((*engine)->Save(1, Views(State())).ok());
  }
  auto reader = Reader::Open(root, {});
  ASSERT_TRUE(reader.ok());
  const TensorInfo info = *(*reader)->Find("w.f32");
  reader->reset();
  {
    std::fstream f((*Reader::Open(root, {}))->dir() + "/" + info.shard,
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(info.offset + info.stored_bytes / 2));
    char c;
    f.read(&c, 1);
    f.seekp(static_cast<std::streamoff>(info.offset + info.stored_bytes / 2));
    c ^= 0x5A;
    f.write(&c, 1);
  }
  auto again = Reader::Open(root, {});
  ASSERT_TRUE(again.ok());
  auto got = (*again)->Read("w.f32");
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(got.status().message().find("w.f32"), std::string::npos) << got.status();
  EXPECT_FALSE((*again)->Verify().ok());
  EXPECT_TRUE((*again)->Read("w.bf16").ok());  // the other records are intact
  // Read together, the compressed records are decoded while the next is
  // read: the damaged one still fails the whole read, named, and the read
  // ends (no decoder left waiting).
  auto all = (*again)->ReadAll();
  ASSERT_FALSE(all.ok());
  EXPECT_EQ(all.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(all.status().message().find("w.f32"), std::string::npos) << all.status();
}

// Many compressed records read into caller memory in one call (the
// pipelined path: one ring of twice the largest record shared by every
// record; these records, of different sizes in turn, hold more than the ring,
// so the ring wraps and the reader waits for room) restore bit-exactly,
// twice through one reader.
TEST_P(PlanesCompressionTest, ManyRecordsReadIntoCallerMemory) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  std::vector<OwnedTensor> state = State();
  for (int i = 0; i < 12; ++i) {
    state.push_back(Weights("layer" + std::to_string(i), DType::kFloat32, 20000 + 37000 * (i % 4), 100 + i));
  }
  {
    auto engine = Engine::Open(root, Planes(GetParam()));
    ASSERT_TRUE(engine.ok());
    ASSERT_TRUE((*engine)->Save(1, Views(state)).ok());
  }
  auto reader = Reader::Open(root, {});
  ASSERT_TRUE(reader.ok());
  uint64_t stored = 0, largest = 0;  // of the compressed records
  for (const OwnedTensor& t : state) {
    const TensorInfo* info = (*reader)->Find(t.name);
    if (info->encoding != RecordEncoding::kPlanes) continue;
    stored += info->stored_bytes;
    largest = std::max(largest, info->stored_bytes);
  }
  if (!GetParam()) ASSERT_GT(stored, 2 * largest + 8 * 4096) << "the ring would not wrap";
  for (int round = 0; round < 2; ++round) {
    std::vector<std::vector<uint8_t>> out(state.size());
    std::vector<ReadTarget> targets;
    for (size_t i = 0; i < state.size(); ++i) {
      out[i].assign(state[i].bytes.size() + 1, 0xEE);
      targets.push_back(ReadTarget{state[i].name, out[i].data(), state[i].bytes.size()});
    }
    ASSERT_TRUE((*reader)->ReadInto(targets).ok()) << "round " << round;
    for (size_t i = 0; i < state.size(); ++i) {
      ASSERT_TRUE(std::equal(state[i].bytes.begin(), state[i].bytes.end(), out[i].begin()))
          << state[i].name;
      EXPECT_EQ(out[i].back(), 0xEE) << state[i].name << ": written past its end";
    }
  }
}

// Records whose stored bytes are tiny but whose values are large (a constant
// each, different from record to record): the reader runs far ahead of the
// decoder and keeps wrapping around a ring of a few blocks, so a record's
// room handed out again before it is decoded would give it another record's
// value.
TEST_P(PlanesCompressionTest, AReaderAheadOfTheDecoderNeverOverwritesARecordNotYetDecoded) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  std::vector<OwnedTensor> state;
  for (int i = 0; i < 24; ++i) {
    OwnedTensor t{"const" + std::to_string(i), DType::kFloat32, {1 << 19}, std::vector<uint8_t>(4u << 19)};
    const float v = 0.5f + static_cast<float>(i);
    for (size_t k = 0; k < t.bytes.size(); k += 4) std::memcpy(t.bytes.data() + k, &v, 4);
    state.push_back(std::move(t));
  }
  {
    auto engine = Engine::Open(root, Planes(GetParam()));
    ASSERT_TRUE(engine.ok());
    ASSERT_TRUE((*engine)->Save(1, Views(state)).ok());
  }
  auto reader = Reader::Open(root, {});
  ASSERT_TRUE(reader.ok());
  ASSERT_LT((*reader)->Find("const0")->stored_bytes, 64u << 10) << "not the tiny records this test needs";
  std::vector<std::vector<uint8_t>> out(state.size());
  std::vector<ReadTarget> targets;
  for (size_t i = 0; i < state.size(); ++i) {
    out[i].assign(state[i].bytes.size(), 0);
    targets.push_back(ReadTarget{state[i].name, out[i].data(), state[i].bytes.size()});
  }
  ASSERT_TRUE((*reader)->ReadInto(targets).ok());
  for (size_t i = 0; i < state.size(); ++i) EXPECT_TRUE(out[i] == state[i].bytes) << state[i].name;
}

// A complex number's parts are coded as the floats they are: the planes of a
// complex64 record are cut at 4 bytes (complex128: 8), as docs/format.md
// says, and a RoPE table (cos, sin pairs) shrinks as float32 pairs do.
TEST_P(PlanesCompressionTest, ComplexPartsAreCodedAsTheirFloats) {
  ScratchDir dir;
  const std::string root = dir.Join("root");
  auto engine = Engine::Open(root, Planes(GetParam()));
  ASSERT_TRUE(engine.ok()) << engine.status();
  constexpr int64_t kPositions = 4096, kPairs = 64;
  std::vector<OwnedTensor> state;
  for (DType dtype : {DType::kComplex64, DType::kComplex128}) {
    OwnedTensor t{std::string("freqs_cis.") + std::string(DTypeName(dtype)), dtype, {kPositions, kPairs},
                  std::vector<uint8_t>(kPositions * kPairs * DTypeSize(dtype))};
    for (int64_t pos = 0; pos < kPositions; ++pos) {
      for (int64_t i = 0; i < kPairs; ++i) {
        const double angle = static_cast<double>(pos) * std::pow(10000.0, -2.0 * i / (2 * kPairs));
        uint8_t* p = t.bytes.data() + (pos * kPairs + i) * DTypeSize(dtype);
        if (dtype == DType::kComplex64) {
          const float parts[2] = {static_cast<float>(std::cos(angle)), static_cast<float>(std::sin(angle))};
          std::memcpy(p, parts, sizeof(parts));
        } else {
          const double parts[2] = {std::cos(angle), std::sin(angle)};
          std::memcpy(p, parts, sizeof(parts));
        }
      }
    }
    state.push_back(std::move(t));
  }
  ASSERT_TRUE((*engine)->Save(1, Views(state)).ok());
  ASSERT_TRUE((*engine)->Close().ok());
  ExpectCheckpointEquals(root, 1, state);
  auto reader = Reader::Open(root, ReaderOptions{});
  ASSERT_TRUE(reader.ok()) << reader.status();
  for (const OwnedTensor& t : state) {
    const TensorInfo* info = (*reader)->Find(t.name);
    ASSERT_NE(info, nullptr) << t.name;
    if (GetParam() && info->encoding == RecordEncoding::kRaw) continue;  // the adaptive rule's choice
    ASSERT_EQ(info->encoding, RecordEncoding::kPlanes) << t.name;
    std::ifstream shard((*reader)->dir() + "/" + info->shard, std::ios::binary);
    shard.seekg(static_cast<std::streamoff>(info->offset));
    unsigned char header[3] = {};
    shard.read(reinterpret_cast<char*>(header), 3);
    ASSERT_TRUE(shard.good()) << t.name;
    EXPECT_EQ(header[0], 0xB1) << t.name;
    EXPECT_EQ(header[2], DTypeSize(t.dtype) / 2) << t.name << ": a plane block's element width";
    EXPECT_LT(info->stored_bytes, info->raw_bytes) << t.name;
  }
}

INSTANTIATE_TEST_SUITE_P(Adaptive, PlanesCompressionTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Adaptive" : "Always"; });

}  // namespace
}  // namespace ckpt
