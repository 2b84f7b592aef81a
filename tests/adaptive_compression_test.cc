// The adaptive compression rule: compress while encoding outruns the disk,
// store raw when it does not, sample to follow changes, and refuse tensors
// whose blocks do not shrink.
#include "engine/adaptive_compression.h"

#include "gtest/gtest.h"

namespace ckpt::internal {
namespace {

TEST(AdaptiveCompressionTest, CompressesUntilBothRatesAreMeasured) {
  AdaptiveCompression rule(true);
  rule.BeginSave(1);
  EXPECT_TRUE(rule.CompressGroup());
  rule.Encoded(100 << 20, 1.0);  // 100 MiB/s, no write measured yet
  EXPECT_TRUE(rule.CompressGroup());
}

TEST(AdaptiveCompressionTest, StoresRawWhenTheDiskIsFasterThanTheCodec) {
  AdaptiveCompression rule(true);
  rule.BeginSave(1);
  rule.Encoded(500 << 20, 1.0);   // 500 MiB/s encoding
  rule.Written(1000 << 20, 1.0);  // 1000 MiB/s disk
  int compressed = 0;
  for (int g = 0; g < 64; ++g) compressed += rule.CompressGroup();
  // Only the samples.
  EXPECT_EQ(compressed, 64 / AdaptiveCompression::kSampleEvery);
}

TEST(AdaptiveCompressionTest, CompressesWhenTheDiskIsSlower) {
  AdaptiveCompression rule(true);
  rule.BeginSave(1);
  rule.Encoded(500 << 20, 1.0);
  rule.Written(100 << 20, 1.0);
  for (int g = 0; g < 16; ++g) EXPECT_TRUE(rule.CompressGroup());
}

TEST(AdaptiveCompressionTest, EstimatesCarryOverAndFollowChanges) {
  AdaptiveCompression rule(true);
  rule.BeginSave(1);
  rule.Encoded(500 << 20, 1.0);
  rule.Written(100 << 20, 1.0);
  rule.EndSave();
  rule.BeginSave(1);
  EXPECT_TRUE(rule.CompressGroup());  // the slow disk of the last save
  // The codec slows down (a busy CPU): samples bring the estimate below the disk.
  for (int i = 0; i < 20; ++i) rule.Encoded(10 << 20, 1.0);
  EXPECT_FALSE(rule.CompressGroup());
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
  rule.BeginSave(1);
  rule.Encoded(1 << 20, 1.0);
  rule.Written(1000 << 20, 1.0);
  rule.Block(0, 1000, 1000);
  EXPECT_TRUE(rule.CompressGroup());
  EXPECT_TRUE(rule.TensorWorthwhile(0));
}

}  // namespace
}  // namespace ckpt::internal
