// ckpt/log.h: a program routes the library's log lines and sets their level.
#include "ckpt/log.h"

#include <string>
#include <utility>
#include <vector>

#include "ckpt/engine.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace ckpt {
namespace {

TEST(LogSinkTest, LinesGoToTheSinkAtOrAboveTheThreshold) {
  std::vector<std::pair<LogSeverity, std::string>> lines;
  SetLogSink([&](LogSeverity s, absl::string_view m) { lines.emplace_back(s, std::string(m)); });
  SetLogThreshold(LogSeverity::kInfo);
  testing::ScratchDir dir;
  {
    auto engine = Engine::Open(dir.Join("root"), testing::SmallChunks());
    ASSERT_TRUE(engine.ok()) << engine.status();
  }
  ASSERT_FALSE(lines.empty()) << "opening an engine logs its I/O choice at info level";
  bool names_root = false;
  for (const auto& [severity, message] : lines) {
    EXPECT_GE(severity, LogSeverity::kInfo);
    EXPECT_EQ(message.find("ckpt ["), std::string::npos) << "the sink gets the message alone";
    names_root |= message.find(dir.Join("root")) != std::string::npos;
  }
  EXPECT_TRUE(names_root);

  lines.clear();
  SetLogThreshold(LogSeverity::kWarning);
  {
    auto engine = Engine::Open(dir.Join("root2"), testing::SmallChunks());
    ASSERT_TRUE(engine.ok()) << engine.status();
  }
  for (const auto& [severity, message] : lines) EXPECT_GE(severity, LogSeverity::kWarning) << message;
  SetLogSink(nullptr);
  SetLogThreshold(LogSeverity::kInfo);
}

}  // namespace
}  // namespace ckpt
