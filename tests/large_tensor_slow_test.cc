// A tensor larger than 1 GiB round-trips bit-exactly (slow: labelled "slow").
#include <cstring>

#include "ckpt/engine.h"
#include "ckpt/reader.h"
#include "gtest/gtest.h"
#include "test_util.h"
#include "util/hash.h"

namespace ckpt {
namespace {

TEST(LargeTensorTest, MoreThanOneGibRoundTrips) {
  testing::ScratchDir dir;
  const size_t n = (size_t{1} << 30) + 12345;  // not a multiple of anything
  auto source = AlignedBytes::Allocate(n, /*prefault=*/false);
  ASSERT_TRUE(source.ok());
  auto* words = static_cast<uint64_t*>(source->data());
  for (size_t i = 0; i < n / 8; ++i) words[i] = i * 0x9E3779B97F4A7C15ull;
  std::memset(static_cast<char*>(source->data()) + n / 8 * 8, 0xAB, n % 8);
  const uint64_t want = internal::Xxh3(source->data(), n);

  auto engine = Engine::Open(dir.Join("root"), EngineOptions{});
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::vector<TensorView> views = {
      TensorView{"huge.weight", DType::kUInt8, {static_cast<int64_t>(n)}, source->data(), n},
      TensorView{"huge.bias", DType::kFloat32, {3}, source->data(), 12}};
  auto stats = (*engine)->Save(1, views);
  ASSERT_TRUE(stats.ok()) << stats.status();

  auto reader = Reader::Open(dir.Join("root"), ReaderOptions{});
  ASSERT_TRUE(reader.ok()) << reader.status();
  ASSERT_TRUE((*reader)->Verify().ok());
  // Read back into the same (already faulted) memory after clearing it.
  std::memset(source->data(), 0, n);
  ReadTarget target{"huge.weight", source->data(), n};
  ASSERT_TRUE((*reader)->ReadInto({&target, 1}).ok());
  EXPECT_EQ(internal::Xxh3(source->data(), n), want);
}

}  // namespace
}  // namespace ckpt
