// A test that hangs is worse than one that fails, and worse still when the
// only trace it leaves is ctest's "Timeout" after 15 minutes. Every GoogleTest
// binary linked with ckpt_test_util gets this watchdog: when one test case
// runs longer than CKPT_TEST_HANG_S seconds (default 600, below ctest's 900),
// it prints the test's name and every thread's stack (through gdb, when it is
// installed) and aborts, so CI shows where it was stuck. CKPT_TEST_HANG_S=0
// turns it off (e.g. under a debugger).
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>

#include "gtest/gtest.h"

namespace ckpt::testing {
namespace {

// What the watchdog thread watches. Never freed: the detached thread may
// still read it while the process exits (gtest deletes its listeners then).
struct WatchState {
  std::mutex mu;
  std::string name;
  std::chrono::steady_clock::time_point started;
  bool running = false;
};

[[noreturn]] void Watch(WatchState* state, std::chrono::seconds limit) {
  while (true) {
    std::this_thread::sleep_for(std::chrono::seconds(5));
    std::string name;
    {
      std::lock_guard<std::mutex> lock(state->mu);
      if (!state->running || std::chrono::steady_clock::now() - state->started < limit) continue;
      name = state->name;
    }
    std::fprintf(stderr, "\n*** %s has run for more than %lld s: it hangs. Every thread's stack:\n",
                 name.c_str(), static_cast<long long>(limit.count()));
    std::fflush(stderr);
    const std::string gdb = "gdb -p " + std::to_string(getpid()) +
                            " -batch -nx -ex 'set pagination off' -ex 'thread apply all bt' "
                            "</dev/null 1>&2 2>/dev/null || echo '(gdb is not installed)' 1>&2";
    (void)std::system(gdb.c_str());
    std::fprintf(stderr, "*** aborting %s\n", name.c_str());
    std::fflush(stderr);
    ::abort();
  }
}

class HangWatchdog final : public ::testing::EmptyTestEventListener {
 public:
  explicit HangWatchdog(WatchState* state) : state_(state) {}

  void OnTestStart(const ::testing::TestInfo& info) override {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->name = std::string(info.test_suite_name()) + "." + info.name();
    state_->started = std::chrono::steady_clock::now();
    state_->running = true;
  }
  void OnTestEnd(const ::testing::TestInfo&) override {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->running = false;
  }

 private:
  WatchState* const state_;
};

const bool kInstalled = [] {
  long seconds = 600;
  if (const char* env = getenv("CKPT_TEST_HANG_S"); env != nullptr) seconds = atol(env);
  if (seconds > 0) {
    static WatchState* const state = new WatchState;
    std::thread(Watch, state, std::chrono::seconds(seconds)).detach();  // lives as long as the process
    ::testing::UnitTest::GetInstance()->listeners().Append(new HangWatchdog(state));
  }
  return true;
}();

}  // namespace
}  // namespace ckpt::testing
