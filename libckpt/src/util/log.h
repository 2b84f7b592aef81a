// The library's leveled logging: to the sink and threshold of ckpt/log.h
// (stderr and CKPT_LOG by default). Levels match `ckpt::LogSeverity`.
#ifndef CKPT_UTIL_LOG_H_
#define CKPT_UTIL_LOG_H_

#include "absl/strings/string_view.h"

namespace ckpt::internal {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kOff = 4 };

bool LogEnabled(LogLevel level);
// Hands `message` to the sink set by `ckpt::SetLogSink`, or writes
// "ckpt [level] message\n" to stderr in one write(2).
void Log(LogLevel level, absl::string_view message);

}  // namespace ckpt::internal

#endif  // CKPT_UTIL_LOG_H_
