// Byte-plane blocks (delta/plane_codec.h): bit-exact round trips for every
// element size and the float values that break naive codecs, sizes from
// nothing to several blocks, and hostile payloads refused with kDataLoss.
#include "delta/plane_codec.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace ckpt::internal {
namespace {

std::vector<char> Encode(const std::vector<char>& data, size_t elem, int level = 1,
                         bool store_raw = false, const char* xor_with = nullptr) {
  std::vector<char> out;
  for (size_t off = 0; off < data.size(); off += kPlaneBlockBytes) {
    const size_t len = std::min(kPlaneBlockBytes, data.size() - off);
    const size_t before = out.size();
    absl::Status s = AppendPlaneBlock(data.data() + off, len, elem, level, store_raw, &out,
                                      xor_with == nullptr ? nullptr : xor_with + off);
    EXPECT_TRUE(s.ok()) << s;
    EXPECT_LE(out.size() - before, PlaneBlockBound(len, elem));
  }
  return out;
}

std::vector<char> Decode(const std::vector<char>& payload, size_t elem, size_t n,
                         WorkerPool* pool = nullptr) {
  std::vector<char> dst(n, 0x55);
  absl::Status s = DecodePlaneBlocks(payload.data(), payload.size(), elem, dst.data(), n, false, pool);
  EXPECT_TRUE(s.ok()) << s;
  return dst;
}

template <typename T>
std::vector<char> Bytes(const std::vector<T>& v) {
  std::vector<char> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// Floats of every awkward kind: NaNs (quiet, signalling, several payloads,
// both signs), +-0, +-inf, denormals, extremes, then normal values.
std::vector<float> AwkwardFloats(size_t n, uint64_t seed) {
  std::vector<uint32_t> special = {0x7FC00000, 0x7FC00001, 0xFFC12345, 0x7F800001, 0x7FBFFFFF,
                                   0xFF800001, 0x80000000, 0x00000000, 0x7F800000, 0xFF800000,
                                   0x00000001, 0x807FFFFF, 0x00400000, 0x7F7FFFFF, 0xFF7FFFFF};
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    v[i] = i % 7 == 0 ? std::bit_cast<float>(special[(i / 7) % special.size()]) : normal(rng);
  }
  return v;
}

std::vector<char> RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<char> b(n);
  for (char& c : b) c = static_cast<char>(rng());
  return b;
}

TEST(PlaneCodecTest, RoundTripsEveryElementSizeAndLength) {
  for (size_t elem : {1u, 2u, 4u, 8u}) {
    for (size_t count : {0u, 1u, 2u, 3u, 17u, 4097u, 100003u}) {
      const std::vector<char> data = RandomBytes(count * elem, count + elem);
      for (bool raw : {false, true}) {
        const std::vector<char> payload = Encode(data, elem, 1, raw);
        EXPECT_EQ(Decode(payload, elem, data.size()), data) << elem << " x " << count;
      }
    }
  }
}

TEST(PlaneCodecTest, RoundTripsAwkwardFloatsBitExactly) {
  const std::vector<float> f = AwkwardFloats(300001, 1);
  const std::vector<char> data = Bytes(f);
  for (int level : {-5, 1, 3}) {
    EXPECT_EQ(Decode(Encode(data, 4, level), 4, data.size()), data) << level;
  }
  // The same values as bf16, fp16-like and fp64 bit patterns.
  std::vector<uint16_t> bf16(f.size());
  for (size_t i = 0; i < f.size(); ++i) bf16[i] = std::bit_cast<uint32_t>(f[i]) >> 16;
  const std::vector<char> b16 = Bytes(bf16);
  EXPECT_EQ(Decode(Encode(b16, 2), 2, b16.size()), b16);
  std::vector<uint16_t> fp16 = {0x7C00, 0xFC00, 0x7E00, 0x7C01, 0x8000, 0x0000, 0x0001, 0x03FF};
  fp16.resize(5000, 0x3C00);
  const std::vector<char> h16 = Bytes(fp16);
  EXPECT_EQ(Decode(Encode(h16, 2), 2, h16.size()), h16);
  std::vector<double> d(f.begin(), f.end());
  d.push_back(std::bit_cast<double>(uint64_t{0x7FF0000000000001}));  // signalling NaN
  d.push_back(std::bit_cast<double>(uint64_t{0xFFF8DEADBEEF0001}));
  d.push_back(std::numeric_limits<double>::denorm_min());
  d.push_back(-0.0);
  const std::vector<char> b64 = Bytes(d);
  EXPECT_EQ(Decode(Encode(b64, 8), 8, b64.size()), b64);
}

TEST(PlaneCodecTest, ConstantPlanesAreTinyAndExact) {
  std::vector<char> zeros(3 * kPlaneBlockBytes + 12, 0);
  std::vector<char> payload = Encode(zeros, 4);
  EXPECT_EQ(payload.size(), 4 * (7 + 4 * 5 + 4));  // four blocks of four constant planes
  EXPECT_EQ(Decode(payload, 4, zeros.size()), zeros);
  std::vector<float> equal(250000, -1.5f);
  const std::vector<char> data = Bytes(equal);
  payload = Encode(data, 4);
  EXPECT_LT(payload.size(), 100u);
  EXPECT_EQ(Decode(payload, 4, data.size()), data);
}

TEST(PlaneCodecTest, WeightsShrinkAndNoiseStaysRaw) {
  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> w(262144);
  for (float& v : w) v = normal(rng);
  const std::vector<char> data = Bytes(w);
  const std::vector<char> payload = Encode(data, 4);
  EXPECT_LT(payload.size(), data.size() * 9 / 10);
  const std::vector<char> noise = RandomBytes(kPlaneBlockBytes, 4);
  const std::vector<char> stored = Encode(noise, 4);
  EXPECT_EQ(stored.size(), noise.size() + 7);  // one raw block
  EXPECT_EQ(stored[1], 0);
}

TEST(PlaneCodecTest, XorIntoAppliesTheDifference) {
  const std::vector<char> r = RandomBytes(2 * kPlaneBlockBytes + 40, 5);
  std::vector<char> x = r;
  for (size_t i = 0; i < x.size(); i += 4) x[i] ^= static_cast<char>(i);  // low bytes change
  for (bool raw : {false, true}) {
    const std::vector<char> payload = Encode(x, 4, 1, raw, r.data());
    std::vector<char> dst = r;
    ASSERT_TRUE(DecodePlaneBlocks(payload.data(), payload.size(), 4, dst.data(), dst.size(), true).ok());
    EXPECT_EQ(dst, x);
  }
}

TEST(PlaneCodecTest, PoolDecodesTheSame) {
  WorkerPool pool(3, "ckpt-test", 0);
  const std::vector<char> data = Bytes(AwkwardFloats(5 * kPlaneBlockBytes / 4 + 3, 6));
  const std::vector<char> payload = Encode(data, 4);
  EXPECT_EQ(Decode(payload, 4, data.size(), &pool), data);
}

TEST(PlaneCodecTest, RefusesBadArguments) {
  std::vector<char> out;
  const std::vector<char> data(24);
  EXPECT_FALSE(AppendPlaneBlock(data.data(), 6, 4, 1, false, &out).ok());   // not whole elements
  EXPECT_FALSE(AppendPlaneBlock(data.data(), 24, 3, 1, false, &out).ok());  // element size
  EXPECT_TRUE(out.empty());
}

// Every way a payload can lie: each must be kDataLoss, and the decoder must
// not touch memory past n (ASan builds check; here a guard zone is checked).
TEST(PlaneCodecTest, HostilePayloadsAreDataLoss) {
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> w(2 * kPlaneBlockBytes / 4 + 1000);
  for (float& v : w) v = normal(rng);
  const std::vector<char> data = Bytes(w);
  const std::vector<char> good = Encode(data, 4);
  const size_t n = data.size();
  auto refuse = [&](const std::vector<char>& payload, size_t elem, size_t size, const char* what) {
    std::vector<char> dst(size + 64, 0x11);
    absl::Status s = DecodePlaneBlocks(payload.data(), payload.size(), elem, dst.data(), size, false);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << what << ": " << s;
    for (size_t i = size; i < dst.size(); ++i) ASSERT_EQ(dst[i], 0x11) << what;
  };
  // Truncated anywhere.
  for (size_t cut : {size_t{0} + 1, size_t{3}, size_t{7}, size_t{20}, size_t{27}, size_t{100},
                     good.size() / 2, good.size() - 1}) {
    refuse(std::vector<char>(good.begin(), good.begin() + cut), 4, n, "truncated");
  }
  refuse(good, 2, n, "wrong element size");
  refuse(good, 4, n - 4, "blocks cover too many bytes");
  refuse(good, 4, n + 4, "blocks cover too few bytes");
  std::vector<char> bad = good;
  bad[0] = 0x42;
  refuse(bad, 4, n, "bad magic");
  bad = good;
  bad[1] = 9;
  refuse(bad, 4, n, "unknown kind");
  bad = good;
  bad[3] = bad[4] = bad[5] = bad[6] = static_cast<char>(0xFF);
  refuse(bad, 4, n, "huge count");
  bad = good;
  bad[3] = bad[4] = bad[5] = bad[6] = 0;
  refuse(bad, 4, n, "empty block");
  for (size_t k = 0; k < 4; ++k) {
    bad = good;
    bad[7 + 5 * k] = 7;
    refuse(bad, 4, n, "unknown plane mode");
    bad = good;
    bad[7 + 5 * k + 1] ^= 1;  // a plane's length off by one
    refuse(bad, 4, n, "wrong plane length");
    bad = good;
    bad[7 + 5 * k + 4] = static_cast<char>(0x7F);
    refuse(bad, 4, n, "huge plane length");
  }
  // Corrupt data inside the first block's first zstd plane.
  ASSERT_EQ(good[1], 1);  // a planes block
  size_t at = 27;
  bool corrupted = false;
  for (size_t k = 0; k < 4 && !corrupted; ++k) {
    uint32_t len;
    std::memcpy(&len, &good[7 + 5 * k + 1], 4);
    if (good[7 + 5 * k] == 0) {
      bad = good;
      for (size_t i = at + len / 2; i < at + len / 2 + 16; ++i) bad[i] ^= 0x5A;
      refuse(bad, 4, n, "corrupt zstd");
      corrupted = true;
    }
    at += len;
  }
  EXPECT_TRUE(corrupted);
  bad = good;
  bad.push_back(0);
  refuse(bad, 4, n, "trailing byte");
  refuse(good, 4, 0, "record of nothing");
  // Random garbage never crashes.
  for (int t = 0; t < 200; ++t) {
    std::vector<char> junk = RandomBytes(3 + rng() % 200, t);
    junk[0] = static_cast<char>(0xB1);
    junk[2] = static_cast<char>(4);
    std::vector<char> dst(400);
    (void)DecodePlaneBlocks(junk.data(), junk.size(), 4, dst.data(), 400, t % 2 == 0);
  }
}

}  // namespace
}  // namespace ckpt::internal
