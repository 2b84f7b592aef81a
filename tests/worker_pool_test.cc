#include "util/worker_pool.h"

#include <atomic>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace ckpt::internal {
namespace {

TEST(WorkerPoolTest, RunsEveryIterationOnce) {
  WorkerPool pool(3, "ckpt-test", 0);
  EXPECT_EQ(pool.threads(), 3);
  for (size_t n : {0u, 1u, 2u, 7u, 1000u}) {
    std::vector<std::atomic<int>> hits(n);
    pool.ParallelFor(n, [&](size_t i) { hits[i].fetch_add(1); });
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 1) << "n " << n << " i " << i;
  }
}

TEST(WorkerPoolTest, UsesHelperThreads) {
  WorkerPool pool(2, "ckpt-test", 0);
  std::atomic<int> inside{0};
  std::atomic<bool> overlapped{false};
  pool.ParallelFor(2, [&](size_t) {
    inside.fetch_add(1);
    // Both iterations run at once when a helper takes one (bounded wait).
    for (int spin = 0; spin < 2000 && inside.load() < 2; ++spin) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (inside.load() == 2) overlapped = true;
  });
  EXPECT_TRUE(overlapped.load());
}

TEST(WorkerPoolTest, CallsFromSeveralThreadsAreSerialized) {
  WorkerPool pool(2, "ckpt-test", 0);
  std::atomic<long> sum{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&] {
      for (int round = 0; round < 50; ++round) {
        pool.ParallelFor(10, [&](size_t i) { sum.fetch_add(static_cast<long>(i)); });
      }
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(sum.load(), 4L * 50 * 45);
}

TEST(WorkerPoolTest, OneThreadRunsOnTheCaller) {
  WorkerPool pool(1, "ckpt-test", 0);
  const auto caller = std::this_thread::get_id();
  pool.ParallelFor(5, [&](size_t) { EXPECT_EQ(std::this_thread::get_id(), caller); });
}

}  // namespace
}  // namespace ckpt::internal
