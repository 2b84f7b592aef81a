// A real full disk: saves into a small file system (a tmpfs or a loop-mounted
// ext4 image that tests/full_disk/run.sh mounts as root and names in
// $CKPT_FULL_DISK_DIR) are filled until the disk is full. They must fail with
// a clear ENOSPC error (kResourceExhausted), leave no temp directory, keep
// every earlier checkpoint verifiable, and the same engine must save again
// once space returns. Without $CKPT_FULL_DISK_DIR every test skips.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ckpt/engine.h"
#include "ckpt/reader.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace ckpt {
namespace {

using testing::OwnedTensor;
using testing::RandomTensor;
using testing::Views;
using testing::WaitOrDie;

struct DiskCase {
  const char* name;
  DeltaOptions::Mode delta;
  bool lazy;
  int compression;
  IoBackend backend;
};

// Writes `path` until the file system refuses (ENOSPC): 1 MiB writes, then
// 4 KiB ones, so at most a few blocks stay free. (statvfs is not enough:
// ext4 keeps clusters back for delayed allocation that other writes may use.)
// Returns the bytes written.
uint64_t FillDisk(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return 0;
  std::vector<char> block(1 << 20, 'x');
  uint64_t written = 0;
  for (size_t n : {block.size(), size_t{4096}}) {
    while (true) {
      const ssize_t w = ::write(fd, block.data(), n);
      if (w <= 0) break;
      written += static_cast<uint64_t>(w);
    }
    ::fsync(fd);  // delayed allocations land: what is left is really free
  }
  ::close(fd);
  return written;
}

class FullDiskTest : public ::testing::TestWithParam<DiskCase> {
 protected:
  void SetUp() override {
    const char* dir = std::getenv("CKPT_FULL_DISK_DIR");
    if (dir == nullptr || *dir == '\0') GTEST_SKIP() << "CKPT_FULL_DISK_DIR not set (tests/full_disk/run.sh sets it)";
    base_ = dir;
    root_ = absl::StrCat(base_, "/root-", GetParam().name);
    filler_ = absl::StrCat(base_, "/filler-", GetParam().name);
    testing::RemoveTree(root_);
    ::unlink(filler_.c_str());
  }
  void TearDown() override {
    if (base_.empty()) return;
    testing::RemoveTree(root_);
    ::unlink(filler_.c_str());
  }

  EngineOptions Options() const {
    EngineOptions options = testing::SmallChunks();
    options.delta.mode = GetParam().delta;
    options.delta.full_every = 1000;  // every save after the first a delta, in delta modes
    options.lazy_staging = GetParam().lazy;
    options.compression_level = GetParam().compression;
    options.io.backend = GetParam().backend;
    options.stall_timeout = absl::Seconds(60);
    return options;
  }

  std::string base_, root_, filler_;
};

TEST_P(FullDiskTest, SavesFailWithEnospcAndResumeOnceSpaceReturns) {
  // ~3 MB of state: incompressible, and changed in full between saves so a
  // delta is as large as the state.
  std::vector<OwnedTensor> state;
  state.push_back(RandomTensor("embed.weight", DType::kFloat32, {512, 1024}, 1));
  for (int i = 0; i < 4; ++i) {
    state.push_back(RandomTensor(absl::StrCat("blocks.", i, ".w"), DType::kBFloat16, {256, 1024}, 10 + i));
    state.push_back(RandomTensor(absl::StrCat("blocks.", i, ".norm"), DType::kFloat32, {1024}, 20 + i));
  }
  auto engine = Engine::Open(root_, Options());
  ASSERT_TRUE(engine.ok()) << engine.status();
  auto save = [&](int64_t step) -> absl::Status {
    for (OwnedTensor& t : state) testing::FillRandom(t.bytes, 1000 * step + t.bytes.size());
    auto handle = (*engine)->SaveAsync(step, Views(state));
    if (!handle.ok()) return handle.status();
    return WaitOrDie(**handle, absl::Seconds(120), absl::StrCat("save ", step));
  };
  ASSERT_TRUE(save(1).ok());
  const std::vector<OwnedTensor> step1 = state;

  // Leave no room for anything.
  const uint64_t filled = FillDisk(filler_);
  ASSERT_GT(filled, 0u) << "could not fill " << base_;
  absl::Status full = save(2);
  // A save that happened to fit (a very small delta) would not test anything:
  // the state changed entirely, so it cannot.
  ASSERT_FALSE(full.ok()) << "a 3 MB save (60 KB as a top-k delta) fitted into a full disk";
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_NE(full.message().find("ENOSPC"), std::string::npos) << full;
  // Nothing of step 2 is visible or left behind; step 1 verifies.
  EXPECT_TRUE(testing::Leftovers(root_).empty()) << testing::Leftovers(root_)[0];
  {
    ReaderOptions read;  // newest
    auto reader = Reader::Open(root_, read);
    ASSERT_TRUE(reader.ok()) << reader.status();
    EXPECT_EQ((*reader)->step(), 1);
    EXPECT_TRUE((*reader)->Verify().ok());
  }
  testing::ExpectCheckpointEquals(root_, 1, step1);

  // Space returns: the same engine saves again (a full checkpoint: the
  // failed save left no base a delta could use, and step 1 still is one).
  ASSERT_EQ(::unlink(filler_.c_str()), 0);
  absl::Status again = save(3);
  ASSERT_TRUE(again.ok()) << again;
  ASSERT_TRUE((*engine)->Close().ok());
  testing::ExpectCheckpointEquals(root_, 3, state);
  testing::ExpectCheckpointEquals(root_, 1, step1);
}

INSTANTIATE_TEST_SUITE_P(
    Modes, FullDiskTest,
    ::testing::Values(DiskCase{"Full", DeltaOptions::Mode::kNone, false, 0, IoBackend::kAuto},
                      DiskCase{"FullThreads", DeltaOptions::Mode::kNone, false, 0, IoBackend::kThreads},
                      DiskCase{"Lazy", DeltaOptions::Mode::kNone, true, 0, IoBackend::kAuto},
                      DiskCase{"ExactDelta", DeltaOptions::Mode::kExact, false, 0, IoBackend::kAuto},
                      DiskCase{"TopKDelta", DeltaOptions::Mode::kTopK, false, 0, IoBackend::kAuto},
                      DiskCase{"Zstd", DeltaOptions::Mode::kNone, false, 3, IoBackend::kAuto}),
    [](const ::testing::TestParamInfo<DiskCase>& info) { return info.param.name; });

}  // namespace
}  // namespace ckpt
