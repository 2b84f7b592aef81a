#include "util/log.h"

#include <unistd.h>

#include <cstdlib>
#include <string>

namespace ckpt::internal {
namespace {

LogLevel Threshold() {
  static const LogLevel threshold = [] {
    const char* env = std::getenv("CKPT_LOG");
    std::string v = env != nullptr ? env : "info";
    if (v == "debug") return LogLevel::kDebug;
    if (v == "warning") return LogLevel::kWarning;
    if (v == "error") return LogLevel::kError;
    if (v == "off") return LogLevel::kOff;
    return LogLevel::kInfo;
  }();
  return threshold;
}

const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarning: return "warning";
    case LogLevel::kError: return "error";
    default: return "";
  }
}

}  // namespace

bool LogEnabled(LogLevel level) { return level >= Threshold() && level != LogLevel::kOff; }

void Log(LogLevel level, absl::string_view message) {
  if (!LogEnabled(level)) return;
  std::string line = std::string("ckpt [") + LevelName(level) + "] ";
  line.append(message.data(), message.size());
  line.push_back('\n');
  ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
}

}  // namespace ckpt::internal
