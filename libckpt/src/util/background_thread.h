// Naming and de-prioritising the engine's background threads.
#ifndef CKPT_UTIL_BACKGROUND_THREAD_H_
#define CKPT_UTIL_BACKGROUND_THREAD_H_

namespace ckpt::internal {

// Names the calling thread (as `top -H`, gdb and /proc show it; at most 15
// characters) and, when `nice` > 0, lowers its scheduling priority by that
// much (Linux schedules threads, so this affects only the caller), so a
// training loop's threads win the CPU when both want it. Best effort: a
// failure is logged once at debug level and otherwise ignored.
void BecomeBackgroundThread(const char* name, int nice);

}  // namespace ckpt::internal

#endif  // CKPT_UTIL_BACKGROUND_THREAD_H_
