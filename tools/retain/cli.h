// tools/retain/cli.h: the command line of ckpt-retain, apart from `main`, so
// that tests can run it in-process. See docs/retention.md.
#ifndef CKPT_TOOLS_RETAIN_CLI_H_
#define CKPT_TOOLS_RETAIN_CLI_H_

#include <ostream>

namespace ckpt::tools {

// Exit codes of ckpt-retain. Stable: cron jobs and scripts test them.
// Documented in --help and docs/retention.md.
enum RetainExitCode : int {
  kRetainOk = 0,
  kRetainActionFailed = 1,  // some action failed; the others still ran
  kRetainUsage = 2,         // bad flags, no rule, a cold dir in or around ROOT, ...
  kRetainNotFound = 3,      // ROOT or the cold dir is missing
  kRetainError = 4,         // another ckpt-retain holds ROOT, or any other error
};

// Runs ckpt-retain with `argv[1..argc)`: parses the flags (`--help` prints the
// usage and every flag to `out` and returns 0; a bad flag writes one line to
// `err` and returns 2), runs the retention job and prints one line (or JSON
// object) per action to `out`. Diagnostics go to `err`, each one line starting
// with "ckpt-retain: ". Returns a `RetainExitCode`.
int RetainMain(int argc, const char* const* argv, std::ostream& out, std::ostream& err);

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_RETAIN_CLI_H_
