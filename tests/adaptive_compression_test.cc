// The adaptive compression rule: measure compressed and raw saves, keep the
// faster (compression within a few percent), resample the other, and refuse
// tensors whose blocks do not shrink.
#include "engine/adaptive_compression.h"

#include "gtest/gtest.h"

namespace ckpt::internal {
namespace {

constexpr uint64_t kGB = 1000000000;

TEST(AdaptiveCompressionTest, MeasuresCompressedThenRaw) {
  AdaptiveCompression rule(true);
  EXPECT_TRUE(rule.CompressSave());
  rule.Saved(true, kGB, 2.0);
  EXPECT_FALSE(rule.CompressSave());
  rule.Saved(false, kGB, 1.0);
}

TEST(AdaptiveCompressionTest, StoresRawWhenTheDiskIsFasterThanTheCodec) {
  AdaptiveCompression rule(true);
  rule.Saved(true, kGB, 2.0);   // compressed: 0.5 GB/s
  rule.Saved(false, kGB, 1.0);  // raw: 1 GB/s
  int compressed = 0;
  for (int s = 0; s < 64; ++s) compressed += rule.CompressSave();
  EXPECT_EQ(compressed, 64 / AdaptiveCompression::kResampleEvery);  // only the resamples
}

TEST(AdaptiveCompressionTest, CompressesWhenItIsAsFastOrFaster) {
  AdaptiveCompression rule(true);
  rule.Saved(true, kGB, 1.0);
  rule.Saved(false, kGB, 0.98);  // compression within the slack
  int raw = 0;
  for (int s = 0; s < 64; ++s) raw += !rule.CompressSave();
  EXPECT_EQ(raw, 64 / AdaptiveCompression::kResampleEvery);
}

TEST(AdaptiveCompressionTest, FollowsAChangingDisk) {
  AdaptiveCompression rule(true);
  rule.Saved(true, kGB, 1.0);
  rule.Saved(false, kGB, 0.5);  // a fast disk
  EXPECT_FALSE(rule.CompressSave());
  for (int i = 0; i < 10; ++i) rule.Saved(false, kGB, 4.0);  // it became slow (a network FS)
  EXPECT_TRUE(rule.CompressSave());
}

TEST(AdaptiveCompressionTest, RefusesATensorWhoseBlocksDoNotShrink) {
  AdaptiveCompression rule(true);
  rule.BeginSave(3);
  rule.Block(0, 1000, 990);  // incompressible
  rule.Block(1, 1000, 700);
  EXPECT_FALSE(rule.TensorWorthwhile(0));
  EXPECT_TRUE(rule.TensorWorthwhile(1));
  EXPECT_TRUE(rule.TensorWorthwhile(2));
  rule.BeginSave(3);  // tried again in the next save
  EXPECT_TRUE(rule.TensorWorthwhile(0));
}

TEST(AdaptiveCompressionTest, DisabledCompressesEverything) {
  AdaptiveCompression rule(false);
  rule.Saved(true, kGB, 10.0);
  rule.Saved(false, kGB, 1.0);
  rule.BeginSave(1);
  rule.Block(0, 1000, 1000);
  for (int s = 0; s < 40; ++s) EXPECT_TRUE(rule.CompressSave());
  EXPECT_TRUE(rule.TensorWorthwhile(0));
}

}  // namespace
}  // namespace ckpt::internal
