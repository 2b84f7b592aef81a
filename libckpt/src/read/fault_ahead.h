// `FaultAhead`: faults fresh caller memory in on helper threads, in the order
// a read will fill it, while the read runs. O_DIRECT reads into memory never
// touched pin it page by page, and pinning faults each page in (allocating
// and zeroing it) on the thread that submits the read -- for a restore into
// new memory (`Reader::ReadAll`, a fresh `ckpt.load`) that first touch, not
// the disk, sets the pace. With the pages faulted ahead by other cores, the
// submitting thread finds them present.
//
// Large ranges are advised to use transparent huge pages first. Faulting
// uses madvise(MADV_POPULATE_WRITE), which maps pages writable
// without changing a byte already there, so it is safe to race with the read
// that fills the same memory. Where the kernel lacks it (before 5.14) nothing
// is faulted ahead.
#ifndef CKPT_READ_FAULT_AHEAD_H_
#define CKPT_READ_FAULT_AHEAD_H_

#include <atomic>
#include <cstddef>
#include <span>
#include <thread>
#include <vector>

namespace ckpt::internal {

class FaultAhead {
 public:
  struct Range {
    char* data = nullptr;
    size_t bytes = 0;
  };

  // Starts faulting in `ranges`, in order, on up to `threads` threads (none
  // when there is less than `kMinBytes` in all). `ranges` must stay
  // allocated until destruction.
  FaultAhead(std::span<const Range> ranges, int threads);
  // Stops faulting what is left, waits for the threads.
  ~FaultAhead();
  FaultAhead(const FaultAhead&) = delete;
  FaultAhead& operator=(const FaultAhead&) = delete;

  // Faults in `bytes` at `data` now, on the calling thread. False where
  // MADV_POPULATE_WRITE is unsupported.
  static bool Populate(char* data, size_t bytes);

  // Asks for transparent huge pages over the 2 MiB-aligned interior of
  // `bytes` at `data` (best effort): one fault per 2 MiB instead of 512.
  static void AdviseHugePages(char* data, size_t bytes);

  // Ranges at least this large get `AdviseHugePages`.
  static constexpr size_t kHugeRangeBytes = size_t{8} << 20;
  // Less than this in all is not worth a thread.
  static constexpr size_t kMinBytes = size_t{8} << 20;
  // Each thread takes this much of the memory at a time, in order.
  static constexpr size_t kSliceBytes = size_t{2} << 20;

 private:
  void Run();

  std::vector<Range> slices_;       // the ranges cut into slices, in read order
  std::atomic<size_t> next_{0};     // next slice to fault
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
};

}  // namespace ckpt::internal

#endif  // CKPT_READ_FAULT_AHEAD_H_
