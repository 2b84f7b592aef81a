// Exact deltas (delta/delta_codec.h) at the codec level: every encoding
// round-trips bit-exactly for every dtype, the selection keeps the smallest
// candidate, xor_planes beats plain xor on AdamW-like changes, planes
// records round-trip, and malformed payloads are kDataLoss.
#include "delta/delta_codec.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "delta/plane_codec.h"
#include "testing/codec_testing.h"
#include "zstd.h"
#include "gtest/gtest.h"

namespace ckpt::internal {
namespace {

// An AdamW-like step of one fp32 tensor: weights w ~ N(0, 0.02) moved by
// ~1e-3 relative, and both moments updated.
struct AdamState {
  std::vector<float> w, m, v;
};

AdamState MakeAdam(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  AdamState s{std::vector<float>(n), std::vector<float>(n), std::vector<float>(n)};
  for (size_t i = 0; i < n; ++i) {
    const float g = 0.01f * normal(rng);
    s.w[i] = 0.02f * normal(rng);
    s.m[i] = 0.1f * g;
    s.v[i] = 0.001f * g * g + 1e-12f;
  }
  return s;
}

AdamState Step(const AdamState& s, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  AdamState t = s;
  for (size_t i = 0; i < s.w.size(); ++i) {
    const float g = 0.01f * normal(rng);
    t.m[i] = 0.9f * s.m[i] + 0.1f * g;
    t.v[i] = 0.999f * s.v[i] + 0.001f * g * g;
    t.w[i] = s.w[i] - 1e-3f * t.m[i] / (std::sqrt(t.v[i]) + 1e-8f) * 0.02f - 1e-5f * s.w[i];
  }
  return t;
}

template <typename T>
std::vector<char> Bytes(const std::vector<T>& v) {
  std::vector<char> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

std::vector<uint16_t> ToBf16(const std::vector<float>& f) {
  std::vector<uint16_t> b(f.size());
  for (size_t i = 0; i < f.size(); ++i) {
    uint32_t u = std::bit_cast<uint32_t>(f[i]);
    u += 0x7FFF + ((u >> 16) & 1);
    b[i] = static_cast<uint16_t>(u >> 16);
  }
  return b;
}

// Encodes X against R (pieces cut at `piece_bytes`), checks R became X,
// applies the delta to a copy of the old R and checks it gives X back.
DeltaRecord RoundTrip(const std::vector<char>& x, const std::vector<char>& r0, DType dtype,
                      WorkerPool* pool = nullptr, size_t piece_bytes = 0) {
  std::vector<Piece> pieces;
  const size_t elem = DTypeSize(dtype);
  const size_t step = piece_bytes == 0 ? std::max<size_t>(x.size(), 1) : piece_bytes * elem;
  for (size_t off = 0; off < x.size(); off += step) {
    pieces.push_back({x.data() + off, std::min(step, x.size() - off)});
  }
  std::vector<char> r = r0;
  auto record = EncodeExactDelta(pieces, r.data(), x.size(), dtype, 1, pool);
  EXPECT_TRUE(record.ok()) << record.status();
  if (!record.ok()) return {};
  EXPECT_EQ(r, x) << "R must become X";
  std::vector<char> dst = r0;
  absl::Status s = ApplyDelta(record->encoding, record->bytes.data(), record->bytes.size(),
                              dst.data(), dst.size(), dtype, pool);
  EXPECT_TRUE(s.ok()) << RecordEncodingName(record->encoding) << ": " << s;
  EXPECT_TRUE(dst == x) << RecordEncodingName(record->encoding) << " not bit-exact";
  return *std::move(record);
}

std::vector<char> RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<char> b(n);
  for (char& c : b) c = static_cast<char>(rng());
  return b;
}

TEST(DeltaCodecTest, EveryDtypeAndChangeRateRoundTrips) {
  WorkerPool pool(3, "ckpt-test", 0);
  for (DType dtype : {DType::kBool, DType::kUInt8, DType::kInt8, DType::kInt16, DType::kInt32,
                      DType::kInt64, DType::kUInt16, DType::kUInt32, DType::kUInt64,
                      DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64}) {
    const size_t elem = DTypeSize(dtype);
    for (size_t count : {0u, 1u, 3u, 1001u, 300007u}) {
      const std::vector<char> r = RandomBytes(count * elem, count);
      for (double fraction : {0.0, 0.01, 0.1, 0.5, 1.0}) {
        std::vector<char> x = r;
        std::mt19937_64 rng(count + elem);
        for (size_t i = 0; i < count; ++i) {
          if (std::uniform_real_distribution<double>(0, 1)(rng) < fraction) x[i * elem] ^= 1 + rng() % 255;
        }
        RoundTrip(x, r, dtype, fraction > 0.4 ? &pool : nullptr, count > 1000 ? 777 : 0);
      }
    }
  }
}

TEST(DeltaCodecTest, AwkwardFloatValuesRoundTrip) {
  // NaNs (quiet, signalling, payloads), -0, infinities and denormals on
  // either side of a change.
  const uint32_t special[] = {0x7FC00000, 0x7FC00001, 0xFFC12345, 0x7F800001, 0x7FBFFFFF,
                              0x80000000, 0x00000000, 0x7F800000, 0xFF800000, 0x00000001,
                              0x807FFFFF};
  std::vector<uint32_t> r(200000), x(200000);
  for (size_t i = 0; i < r.size(); ++i) {
    r[i] = special[i % 11];
    x[i] = i % 3 == 0 ? special[(i + 5) % 11] : r[i] ^ (i & 0xFF);
  }
  EXPECT_EQ(RoundTrip(Bytes(x), Bytes(r), DType::kFloat32).encoding, RecordEncoding::kXorPlanes);
  std::vector<uint64_t> r64(50000), x64(50000);
  for (size_t i = 0; i < r64.size(); ++i) {
    r64[i] = i % 2 ? 0x7FF0000000000001ull : 0x8000000000000000ull;
    x64[i] = i % 5 ? r64[i] : 0x000FFFFFFFFFFFFFull;
  }
  RoundTrip(Bytes(x64), Bytes(r64), DType::kFloat64);
}

TEST(DeltaCodecTest, AdamStepPrefersXorPlanesOverXor) {
  WorkerPool pool(2, "ckpt-test", 0);
  const AdamState a = MakeAdam(3 * kPlaneBlockBytes / 4 + 123, 1);
  const AdamState b = Step(a, 2);
  for (auto [x, r] : {std::pair{&b.w, &a.w}, std::pair{&b.m, &a.m}, std::pair{&b.v, &a.v}}) {
    const std::vector<char> xb = Bytes(*x), rb = Bytes(*r);
    const DeltaRecord record = RoundTrip(xb, rb, DType::kFloat32, &pool);
    EXPECT_EQ(record.encoding, RecordEncoding::kXorPlanes);
    Piece piece{xb.data(), xb.size()};
    auto xor_only = EncodeXorDelta({&piece, 1}, rb.data(), xb.size(), 1);
    ASSERT_TRUE(xor_only.ok());
    EXPECT_LT(record.bytes.size(), xor_only->size());
    EXPECT_LT(record.bytes.size(), xb.size());
  }
  // bf16 weights: fewer elements change (rounding absorbs small updates).
  const std::vector<char> xb = Bytes(ToBf16(b.w)), rb = Bytes(ToBf16(a.w));
  const DeltaRecord record = RoundTrip(xb, rb, DType::kBFloat16, &pool);
  Piece piece{xb.data(), xb.size()};
  auto xor_only = EncodeXorDelta({&piece, 1}, rb.data(), xb.size(), 1);
  ASSERT_TRUE(xor_only.ok());
  EXPECT_LE(record.bytes.size(), xor_only->size());
}

TEST(DeltaCodecTest, SelectionKeepsTheSmallest) {
  // In the ambiguous middle both candidates are encoded: the record must be
  // no larger than either, encoded on its own.
  std::mt19937_64 rng(9);
  std::vector<float> r(200000);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (float& v : r) v = normal(rng);
  for (double fraction : {0.001, 0.05, 0.1, 0.2, 0.3, 0.6}) {
    std::vector<float> x = r;
    for (size_t i = 0; i < x.size(); ++i) {
      if (std::uniform_real_distribution<double>(0, 1)(rng) < fraction) x[i] *= 1.001f;
    }
    const std::vector<char> xb = Bytes(x), rb = Bytes(r);
    const DeltaRecord record = RoundTrip(xb, rb, DType::kFloat32);
    Piece piece{xb.data(), xb.size()};
    auto xor_only = EncodeXorDelta({&piece, 1}, rb.data(), xb.size(), 1);
    ASSERT_TRUE(xor_only.ok());
    if (fraction <= 0.001) EXPECT_EQ(record.encoding, RecordEncoding::kSparse);
    if (fraction >= 0.6) EXPECT_EQ(record.encoding, RecordEncoding::kXorPlanes);
    if (fraction > 1.0 / 32 && fraction < 0.3) {
      // Both were tried: neither alone is smaller.
      std::vector<char> planes;
      for (size_t off = 0; off < xb.size(); off += kPlaneBlockBytes) {
        ASSERT_TRUE(AppendPlaneBlock(xb.data() + off, std::min(kPlaneBlockBytes, xb.size() - off), 4,
                                     1, false, &planes, rb.data() + off).ok());
      }
      EXPECT_LE(record.bytes.size(), planes.size()) << fraction;
    }
    EXPECT_LE(record.bytes.size(), xor_only->size() + 64) << fraction;
  }
}

TEST(DeltaCodecTest, ManyBlocksOnAPoolInSeveralWaves) {
  // 2 threads encode in waves of 8 blocks: 17 blocks take three waves, in
  // pieces that straddle block boundaries.
  WorkerPool pool(2, "ckpt-test", 0);
  const AdamState a = MakeAdam(17 * kPlaneBlockBytes / 4 - 5, 10);
  const AdamState b = Step(a, 11);
  const std::vector<char> x = Bytes(b.w), r = Bytes(a.w);
  const DeltaRecord on_pool = RoundTrip(x, r, DType::kFloat32, &pool, 300001);
  const DeltaRecord alone = RoundTrip(x, r, DType::kFloat32, nullptr, 300001);
  EXPECT_EQ(on_pool.encoding, RecordEncoding::kXorPlanes);
  EXPECT_TRUE(on_pool.bytes == alone.bytes);  // the same payload, whoever encodes it
}

TEST(DeltaCodecTest, UnchangedTensorIsTiny) {
  const std::vector<char> r = RandomBytes(400000, 3);
  const DeltaRecord record = RoundTrip(r, r, DType::kFloat32);
  EXPECT_EQ(record.encoding, RecordEncoding::kSparse);
  EXPECT_EQ(record.changed, 0u);
  EXPECT_LT(record.bytes.size(), 32u);
}

TEST(DeltaCodecTest, PlanesRecordRoundTrips) {
  WorkerPool pool(3, "ckpt-test", 0);
  const AdamState a = MakeAdam(5 * kPlaneBlockBytes / 4 + 7, 4);
  const std::vector<char> x = Bytes(a.w);
  std::vector<Piece> pieces = {{x.data(), 4000}, {x.data() + 4000, x.size() - 4000}};
  for (WorkerPool* p : {static_cast<WorkerPool*>(nullptr), &pool}) {
    auto payload = EncodePlanesRecord(pieces, x.size(), DType::kFloat32, 1, p);
    ASSERT_TRUE(payload.ok()) << payload.status();
    EXPECT_LT(payload->size(), x.size() * 9 / 10);
    std::vector<char> dst(x.size());
    ASSERT_TRUE(DecodePlanesRecord(payload->data(), payload->size(), dst.data(), dst.size(),
                                   DType::kFloat32, p).ok());
    EXPECT_TRUE(dst == x);
  }
}

TEST(DeltaCodecTest, MalformedPayloadsAreDataLoss) {
  const AdamState a = MakeAdam(100000, 5), b = Step(a, 6);
  const std::vector<char> x = Bytes(b.w), r = Bytes(a.w);
  Piece piece{x.data(), x.size()};
  std::vector<char> xor_payload = *EncodeXorDelta({&piece, 1}, r.data(), x.size(), 1);
  std::vector<char> rr = r;
  const DeltaRecord planes = *EncodeExactDelta({&piece, 1}, rr.data(), x.size(), DType::kFloat32, 1);
  std::vector<float> sparse_x = a.w;
  sparse_x[10] = 1;
  const std::vector<char> sx = Bytes(sparse_x);
  Piece sparse_piece{sx.data(), sx.size()};
  rr = r;
  const DeltaRecord sparse = *EncodeExactDelta({&sparse_piece, 1}, rr.data(), sx.size(), DType::kFloat32, 1);
  ASSERT_EQ(planes.encoding, RecordEncoding::kXorPlanes);
  ASSERT_EQ(sparse.encoding, RecordEncoding::kSparse);
  struct Case {
    RecordEncoding encoding;
    std::vector<char> payload;
  };
  const std::vector<Case> cases = {{RecordEncoding::kXor, xor_payload},
                                   {RecordEncoding::kXorPlanes, planes.bytes},
                                   {RecordEncoding::kSparse, sparse.bytes},
                                   {RecordEncoding::kTopK, sparse.bytes}};
  for (const Case& c : cases) {
    std::vector<char> dst = r;
    // Intact, for a record of another size: refused (a sparse payload's
    // indices may fit a smaller record, and then it applies).
    if (c.encoding == RecordEncoding::kXor || c.encoding == RecordEncoding::kXorPlanes) EXPECT_EQ(ApplyDelta(c.encoding, c.payload.data(), c.payload.size(), dst.data(), dst.size() - 4,
                         DType::kFloat32).code(), absl::StatusCode::kDataLoss);
    for (size_t cut : {size_t{0}, size_t{1}, c.payload.size() / 2, c.payload.size() - 1}) {
      dst = r;
      EXPECT_EQ(ApplyDelta(c.encoding, c.payload.data(), cut, dst.data(), dst.size(),
                           DType::kFloat32).code(), absl::StatusCode::kDataLoss)
          << RecordEncodingName(c.encoding) << " cut at " << cut;
    }
    std::vector<char> bad = c.payload;
    bad.push_back(0);
    EXPECT_EQ(ApplyDelta(c.encoding, bad.data(), bad.size(), dst.data(), dst.size(),
                         DType::kFloat32).code(), absl::StatusCode::kDataLoss)
        << RecordEncodingName(c.encoding) << " trailing byte";
  }
  std::vector<char> dst = r;
  EXPECT_EQ(ApplyDelta(RecordEncoding::kXorPlanes, planes.bytes.data(), planes.bytes.size(),
                       dst.data(), dst.size(), DType::kBFloat16).code(),
            absl::StatusCode::kDataLoss);  // wrong element size
  EXPECT_EQ(ApplyDelta(RecordEncoding::kRaw, planes.bytes.data(), planes.bytes.size(), dst.data(),
                       dst.size(), DType::kFloat32).code(),
            absl::StatusCode::kDataLoss);
}

// Payloads as the one-shot encoder before xor_planes wrote them (ZSTD_compress
// of the whole raw payload) still apply exactly.
TEST(DeltaCodecTest, OneShotXorAndSparsePayloadsStillApply) {
  const std::vector<char> r = RandomBytes(100000, 8);
  std::vector<char> x = r;
  for (size_t i = 0; i < x.size(); i += 3) x[i] ^= 0x21;
  std::vector<char> raw = {2};  // kXorTag, then X xor R
  for (size_t i = 0; i < x.size(); ++i) raw.push_back(x[i] ^ r[i]);
  auto compress = [](const std::vector<char>& in) {
    std::vector<char> out(ZSTD_compressBound(in.size()));
    out.resize(ZSTD_compress(out.data(), out.size(), in.data(), in.size(), 3));
    return out;
  };
  std::vector<char> payload = compress(raw);
  std::vector<char> dst = r;
  ASSERT_TRUE(ApplyDelta(RecordEncoding::kXor, payload.data(), payload.size(), dst.data(), dst.size(),
                         DType::kUInt8).ok());
  EXPECT_TRUE(dst == x);
  // sparse: tag 1, count 2, gaps 5 and 0 (indices 5, 6), two float values.
  raw = {1, 2, 5, 0};
  const float values[2] = {1.5f, -0.0f};
  raw.insert(raw.end(), reinterpret_cast<const char*>(values), reinterpret_cast<const char*>(values) + 8);
  payload = compress(raw);
  dst = r;
  ASSERT_TRUE(ApplyDelta(RecordEncoding::kSparse, payload.data(), payload.size(), dst.data(), 40,
                         DType::kFloat32).ok());
  float got[2];
  std::memcpy(got, dst.data() + 20, 8);
  EXPECT_EQ(std::bit_cast<uint32_t>(got[0]), std::bit_cast<uint32_t>(1.5f));
  EXPECT_EQ(std::bit_cast<uint32_t>(got[1]), 0x80000000u);
  EXPECT_TRUE(std::equal(dst.begin() + 28, dst.end(), r.begin() + 28));
}

}  // namespace
}  // namespace ckpt::internal
