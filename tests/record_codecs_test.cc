// The table of record codecs (codec/record_codecs.h): one entry per
// RecordEncoding, and each entry's decode does what its flags say.
#include "codec/record_codecs.h"

#include <cstring>
#include <numeric>
#include <vector>

#include <gtest/gtest.h>

#include "ckpt/kinds.h"
#include "delta/delta_codec.h"
#include "delta/plane_codec.h"
#include "testing/codec_testing.h"

namespace ckpt::internal {
namespace {

TEST(RecordCodecsTest, OneEntryPerEncodingWhoseNameParsesBack) {
  int known = 0;
  for (int i = 0; i < 256; ++i) {
    const RecordEncoding e = static_cast<RecordEncoding>(i);
    const RecordCodec& codec = CodecOf(e);
    if (codec.name == "unknown") continue;
    ++known;
    EXPECT_EQ(codec.encoding, e) << codec.name;
    EXPECT_EQ(ParseRecordEncoding(codec.name), e) << codec.name;
    EXPECT_EQ(RecordEncodingName(e), codec.name);
    EXPECT_EQ(IsDeltaEncoding(e), codec.is_delta) << codec.name;
    EXPECT_FALSE(codec.is_delta && codec.is_compressed) << codec.name << ": a delta is not a full record";
  }
  EXPECT_EQ(known, static_cast<int>(AllRecordCodecs().size()));
  EXPECT_EQ(CodecOf(static_cast<RecordEncoding>(200)).name, "unknown");
}

TEST(RecordCodecsTest, EveryCompressionCodecWritesOneFullEncodingNamedAsIt) {
  for (CompressionCodec codec : {CompressionCodec::kZstd, CompressionCodec::kPlanes}) {
    int entries = 0;
    for (const RecordCodec& c : AllRecordCodecs()) {
      if (c.selected_by != codec) continue;
      ++entries;
      EXPECT_FALSE(c.is_delta) << c.name;
      EXPECT_TRUE(c.is_compressed) << c.name;
      EXPECT_EQ(CompressionCodecName(codec), c.name);
      EXPECT_EQ(ParseCompressionCodec(c.name), codec);
    }
    EXPECT_EQ(entries, 1) << CompressionCodecName(codec);
  }
  EXPECT_EQ(CompressionCodecName(CompressionCodec::kNone), "none");
  EXPECT_FALSE(ParseCompressionCodec("xor_planes").has_value());  // a delta, not a codec option
}

TEST(RecordCodecsTest, FullCodecsDecodeWhatTheirEncodersWrote) {
  std::vector<float> x(300000);
  std::iota(x.begin(), x.end(), 0.5f);
  const size_t n = x.size() * sizeof(float);
  Piece piece{reinterpret_cast<const char*>(x.data()), n};
  auto planes = EncodePlanesRecord({&piece, 1}, n, DType::kFloat32, 1);
  ASSERT_TRUE(planes.ok());
  const RecordCodec& codec = CodecOf(RecordEncoding::kPlanes);
  ASSERT_TRUE(codec.is_compressed);
  EXPECT_GE(planes->size(), codec.min_stored_bytes(n));
  std::vector<char> dst(n);
  ASSERT_TRUE(codec.decode(planes->data(), planes->size(), dst.data(), n, DType::kFloat32, nullptr).ok());
  EXPECT_EQ(std::memcmp(dst.data(), x.data(), n), 0);
  // Raw: exactly n bytes, copied.
  std::vector<char> raw_dst(n);
  const RecordCodec& raw = CodecOf(RecordEncoding::kRaw);
  EXPECT_EQ(raw.min_stored_bytes(n), n);
  ASSERT_TRUE(raw.decode(piece.data, n, raw_dst.data(), n, DType::kFloat32, nullptr).ok());
  EXPECT_EQ(raw_dst, std::vector<char>(piece.data, piece.data + n));
  EXPECT_EQ(raw.decode(piece.data, n - 4, raw_dst.data(), n, DType::kFloat32, nullptr).code(),
            absl::StatusCode::kDataLoss);
}

TEST(RecordCodecsTest, DeltaCodecsApplyToTheBase) {
  std::vector<float> r(5000, 1.0f), x(r);
  for (size_t i = 0; i < x.size(); i += 7) x[i] = static_cast<float>(i);
  std::vector<float> encoded_against = r;
  Piece piece{reinterpret_cast<const char*>(x.data()), x.size() * sizeof(float)};
  auto delta = EncodeExactDelta({&piece, 1}, reinterpret_cast<char*>(encoded_against.data()),
                                piece.bytes, DType::kFloat32, 1);
  ASSERT_TRUE(delta.ok());
  const RecordCodec& codec = CodecOf(delta->encoding);
  ASSERT_TRUE(codec.is_delta);
  std::vector<float> dst = r;
  ASSERT_TRUE(codec.decode(delta->bytes.data(), delta->bytes.size(), reinterpret_cast<char*>(dst.data()),
                           piece.bytes, DType::kFloat32, nullptr)
                  .ok());
  EXPECT_EQ(dst, x);
}

TEST(RecordCodecsTest, SmallestStoredSizesRefuseRecordsClaimingHugeTensors) {
  const uint64_t gib = uint64_t{1} << 30;
  EXPECT_EQ(CodecOf(RecordEncoding::kZstd).min_stored_bytes(gib), gib / 32768);
  EXPECT_EQ(CodecOf(RecordEncoding::kPlanes).min_stored_bytes(gib), kMinPlaneBlockBytes * 1024);
  EXPECT_EQ(CodecOf(RecordEncoding::kXorPlanes).min_stored_bytes(gib), kMinPlaneBlockBytes * 1024);
  EXPECT_EQ(CodecOf(RecordEncoding::kPlanes).min_stored_bytes(0), 0u);
}

}  // namespace
}  // namespace ckpt::internal
