#include "util/background_thread.h"

#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "util/log.h"

namespace ckpt::internal {

void BecomeBackgroundThread(const char* name, int nice) {
  (void)pthread_setname_np(pthread_self(), name);
  if (nice <= 0) return;
  const pid_t tid = static_cast<pid_t>(syscall(SYS_gettid));
  errno = 0;
  const int current = getpriority(PRIO_PROCESS, tid);
  if (errno != 0) return;
  if (setpriority(PRIO_PROCESS, tid, std::min(current + nice, 19)) != 0) {
    Log(LogLevel::kDebug, absl::StrCat("thread ", name, ": setpriority: ", std::strerror(errno)));
  }
}

}  // namespace ckpt::internal
