#include "read/fault_ahead.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>

#include "util/background_thread.h"

namespace ckpt::internal {
namespace {

std::atomic<bool> populate_unsupported{false};

}  // namespace

bool FaultAhead::Populate(char* data, size_t bytes) {
#ifdef MADV_POPULATE_WRITE
  if (populate_unsupported.load(std::memory_order_relaxed)) return false;
  // madvise wants page-aligned starts: take the whole pages inside.
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + page - 1) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + bytes) / page * page;
  if (end <= begin) return true;
  if (::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_WRITE) != 0 &&
      errno == EINVAL) {
    populate_unsupported.store(true, std::memory_order_relaxed);
    return false;
  }
  // Other failures (ENOMEM, EFAULT) leave the pages to be faulted by the read.
  return true;
#else
  (void)data;
  (void)bytes;
  return false;
#endif
}

void FaultAhead::AdviseHugePages(char* data, size_t bytes) {
#ifdef MADV_HUGEPAGE
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + kHuge - 1) / kHuge * kHuge;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + bytes) / kHuge * kHuge;
  if (end > begin) (void)::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#else
  (void)data;
  (void)bytes;
#endif
}

FaultAhead::FaultAhead(std::span<const Range> ranges, int threads) {
  size_t total = 0;
  for (const Range& r : ranges) total += r.bytes;
  if (total < kMinBytes || threads <= 0 || populate_unsupported.load(std::memory_order_relaxed)) return;
  for (const Range& r : ranges) {
    if (r.bytes >= kHugeRangeBytes) AdviseHugePages(r.data, r.bytes);
    for (size_t at = 0; at < r.bytes; at += kSliceBytes) {
      slices_.push_back(Range{r.data + at, std::min(kSliceBytes, r.bytes - at)});
    }
  }
  for (int i = 0; i < threads; ++i) {
    threads_.emplace_back([this] {
      BecomeBackgroundThread("ckpt-fault", 0);
      Run();
    });
  }
}

FaultAhead::~FaultAhead() {
  stop_.store(true, std::memory_order_relaxed);
  for (std::thread& t : threads_) t.join();
}

void FaultAhead::Run() {
  while (!stop_.load(std::memory_order_relaxed)) {
    const size_t i = next_.fetch_add(1, std::memory_order_relaxed);
    if (i >= slices_.size()) return;
    if (!Populate(slices_[i].data, slices_[i].bytes)) return;
  }
}

}  // namespace ckpt::internal
