#include "util/log.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <string>

#include "ckpt/log.h"
#include "util/mutex.h"

namespace ckpt {
namespace {

LogSeverity FromEnvironment() {
  const char* env = std::getenv("CKPT_LOG");
  const std::string v = env != nullptr ? env : "info";
  if (v == "debug") return LogSeverity::kDebug;
  if (v == "warning") return LogSeverity::kWarning;
  if (v == "error") return LogSeverity::kError;
  if (v == "off") return LogSeverity::kOff;
  return LogSeverity::kInfo;
}

std::atomic<int>& Threshold() {
  static std::atomic<int> threshold{static_cast<int>(FromEnvironment())};
  return threshold;
}

struct Sink {
  internal::Mutex mu;
  LogSink sink ABSL_GUARDED_BY(mu);
};

Sink& TheSink() {
  static Sink* sink = new Sink;  // never destroyed: threads may log at exit
  return *sink;
}

const char* LevelName(LogSeverity level) {
  switch (level) {
    case LogSeverity::kDebug: return "debug";
    case LogSeverity::kInfo: return "info";
    case LogSeverity::kWarning: return "warning";
    case LogSeverity::kError: return "error";
    default: return "";
  }
}

}  // namespace

void SetLogSink(LogSink sink) {
  Sink& s = TheSink();
  internal::MutexLock lock(&s.mu);
  s.sink = std::move(sink);
}

void SetLogThreshold(LogSeverity threshold) {
  Threshold().store(static_cast<int>(threshold), std::memory_order_relaxed);
}

bool LogThresholdFromEnvironment() { return std::getenv("CKPT_LOG") != nullptr; }

namespace internal {

bool LogEnabled(LogLevel level) {
  return level != LogLevel::kOff &&
         static_cast<int>(level) >= Threshold().load(std::memory_order_relaxed);
}

void Log(LogLevel level, absl::string_view message) {
  if (!LogEnabled(level)) return;
  const auto severity = static_cast<LogSeverity>(level);
  Sink& s = TheSink();
  {
    MutexLock lock(&s.mu);
    if (s.sink) {
      s.sink(severity, message);
      return;
    }
  }
  std::string line = std::string("ckpt [") + LevelName(severity) + "] ";
  line.append(message.data(), message.size());
  line.push_back('\n');
  ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());  // one write: lines never interleave
  (void)ignored;
}

}  // namespace internal
}  // namespace ckpt
