// Minimal leveled logging to stderr. CKPT_LOG=debug|info|warning|error|off
// (default info) sets the threshold.
#ifndef CKPT_UTIL_LOG_H_
#define CKPT_UTIL_LOG_H_

#include "absl/strings/string_view.h"

namespace ckpt::internal {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kOff = 4 };

bool LogEnabled(LogLevel level);
// Writes "ckpt [level] message\n" to stderr in one write(2).
void Log(LogLevel level, absl::string_view message);

}  // namespace ckpt::internal

#endif  // CKPT_UTIL_LOG_H_
