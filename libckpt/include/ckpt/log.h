// ckpt/log.h: where the library's log lines go.
//
// By default each line is written to stderr as "ckpt [level] message", and
// the environment variable CKPT_LOG=debug|info|warning|error|off (default
// info) sets the least severe level written. A program can route the lines
// into its own logging and set the level in code instead.
#ifndef CKPT_LOG_H_
#define CKPT_LOG_H_

#include <cstdint>
#include <functional>

#include "absl/strings/string_view.h"

namespace ckpt {

enum class LogSeverity : uint8_t { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kOff = 4 };

// Receives every line at or above the threshold (without the "ckpt [level]"
// prefix or a newline). Called from the library's threads, one call at a
// time; it must not call back into ckpt.
using LogSink = std::function<void(LogSeverity severity, absl::string_view message)>;

// Replaces the sink; an empty function restores stderr. Thread-safe.
void SetLogSink(LogSink sink);

// Sets the least severe level logged (kOff: nothing), overriding CKPT_LOG.
// Thread-safe.
void SetLogThreshold(LogSeverity threshold);

// Whether CKPT_LOG is set in the environment (a program that picks a
// default level of its own leaves the user's choice alone).
bool LogThresholdFromEnvironment();

}  // namespace ckpt

#endif  // CKPT_LOG_H_
