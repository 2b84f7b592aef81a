// EngineOptions::background_nice: automatic (-1) is 10 below the caller for
// engines that encode (deltas, zstd) and the caller's own priority for raw
// ones; an explicit value is honoured. Read back from the persister thread's
// /proc entry.
#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <optional>
#include <sstream>

#include "ckpt/engine.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace ckpt {
namespace {

using testing::ScratchDir;

// The nice value of this process's thread named `name`, if there is one.
std::optional<int> ThreadNice(const std::string& name) {
  DIR* dir = ::opendir("/proc/self/task");
  if (dir == nullptr) return std::nullopt;
  std::optional<int> nice;
  while (struct dirent* e = ::readdir(dir)) {
    const std::string tid = e->d_name;
    if (tid == "." || tid == "..") continue;
    std::ifstream comm("/proc/self/task/" + tid + "/comm");
    std::string thread_name;
    std::getline(comm, thread_name);
    if (thread_name != name) continue;
    std::ifstream stat("/proc/self/task/" + tid + "/stat");
    std::string text((std::istreambuf_iterator<char>(stat)), {});
    // Fields after the parenthesised name: state is field 3, nice field 19.
    std::istringstream fields(text.substr(text.rfind(')') + 2));
    std::string field;
    for (int i = 3; i <= 19 && fields >> field; ++i) {
      if (i == 19) nice = std::stoi(field);
    }
  }
  ::closedir(dir);
  return nice;
}

struct NiceCase {
  const char* name;
  DeltaOptions::Mode delta;
  int compression;
  int background_nice;
  int want_above_caller;
};

class BackgroundNiceTest : public ::testing::TestWithParam<NiceCase> {};

TEST_P(BackgroundNiceTest, PersisterRunsAtTheResolvedPriority) {
  const int caller = ::getpriority(PRIO_PROCESS, 0);
  if (caller + GetParam().want_above_caller > 19) GTEST_SKIP() << "caller already at nice " << caller;
  ScratchDir dir;
  EngineOptions options;
  options.delta.mode = GetParam().delta;
  options.compression_level = GetParam().compression;
  options.background_nice = GetParam().background_nice;
  auto engine = Engine::Open(dir.path(), options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::optional<int> nice;
  for (int i = 0; i < 200 && !nice.has_value(); ++i) {  // the thread names itself when it starts
    nice = ThreadNice("ckpt-persist");
    if (!nice.has_value()) ::usleep(10000);
  }
  ASSERT_TRUE(nice.has_value()) << "no ckpt-persist thread";
  EXPECT_EQ(*nice, caller + GetParam().want_above_caller);
}

INSTANTIATE_TEST_SUITE_P(
    Modes, BackgroundNiceTest,
    ::testing::Values(NiceCase{"RawAutomatic", DeltaOptions::Mode::kNone, 0, -1, 0},
                      NiceCase{"ExactDeltaAutomatic", DeltaOptions::Mode::kExact, 0, -1, 10},
                      NiceCase{"TopKAutomatic", DeltaOptions::Mode::kTopK, 0, -1, 10},
                      NiceCase{"ZstdAutomatic", DeltaOptions::Mode::kNone, 3, -1, 10},
                      NiceCase{"RawExplicit", DeltaOptions::Mode::kNone, 0, 7, 7},
                      NiceCase{"DeltaExplicitZero", DeltaOptions::Mode::kExact, 0, 0, 0}),
    [](const ::testing::TestParamInfo<NiceCase>& info) { return info.param.name; });

TEST(BackgroundNiceRangeTest, OutOfRangeIsRejectedAtOpen) {
  for (int bad : {-2, 20}) {
    ScratchDir dir;
    EngineOptions options;
    options.background_nice = bad;
    auto engine = Engine::Open(dir.path(), options);
    ASSERT_FALSE(engine.ok());
    EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(engine.status().message().find("background_nice"), std::string::npos);
  }
}

}  // namespace
}  // namespace ckpt
