#include "util/kill_point.h"

#include <signal.h>
#include <stdlib.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "util/log.h"

namespace ckpt::internal {
namespace {

struct Armed {
  std::string name;  // empty: disarmed
  int64_t occurrence = 1;
  std::atomic<int64_t> reached{0};
};

const Armed& ArmedPoint() {
  static Armed* armed = [] {
    auto* a = new Armed;
    const char* env = getenv("CKPT_KILL_POINT");
    if (env == nullptr || *env == '\0') return a;
    std::pair<std::string, std::string> parts = absl::StrSplit(env, absl::MaxSplits(':', 1));
    a->name = parts.first;
    if (!parts.second.empty() && (!absl::SimpleAtoi(parts.second, &a->occurrence) || a->occurrence < 1)) {
      Log(LogLevel::kError, std::string("CKPT_KILL_POINT=") + env + ": the occurrence must be a positive integer; disarmed");
      a->name.clear();
    }
    return a;
  }();
  return *armed;
}

}  // namespace

void KillPoint(absl::string_view name) {
  const Armed& armed = ArmedPoint();
  if (armed.name.empty() || armed.name != name) return;
  auto& reached = const_cast<std::atomic<int64_t>&>(armed.reached);
  if (reached.fetch_add(1, std::memory_order_relaxed) + 1 == armed.occurrence) {
    ::kill(::getpid(), SIGKILL);
  }
}

}  // namespace ckpt::internal
