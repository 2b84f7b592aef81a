// The CUDA copier merges the stager's pieces into large copies. A copy that
// spans two device allocations is invalid even where they are adjacent in
// virtual memory (torch's caching allocator hands out such segments), so
// merging must stop at an allocation's end. A fake address space stands in
// for the driver: it refuses a copy that leaves its allocation, as
// `cudaMemcpyAsync` does (cudaErrorInvalidValue).
#include "staging/copy_coalescer.h"

#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace ckpt::internal {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

// Device allocations by start address, per device 0 only.
class FakeAddressSpace {
 public:
  // Adds an allocation of `n` bytes right after the previous one (adjacent
  // in virtual memory, as two segments of torch's allocator can be).
  const char* Allocate(size_t n) {
    const uintptr_t start = next_;
    allocations_[start] = n;
    next_ += n;
    return reinterpret_cast<const char*>(start);
  }

  absl::StatusOr<uintptr_t> End(int device, const char* address) const {
    const uintptr_t a = reinterpret_cast<uintptr_t>(address);
    auto it = allocations_.upper_bound(a);
    if (device != 0 || it == allocations_.begin()) return absl::NotFoundError("not device memory");
    --it;
    if (a >= it->first + it->second) return absl::NotFoundError("not device memory");
    return it->first + it->second;
  }

  // What the driver does with a copy: refuse one that leaves its allocation.
  absl::Status Copy(const DeviceCopy& c) const {
    auto end = End(c.device, c.src);
    if (!end.ok()) return end.status();
    if (reinterpret_cast<uintptr_t>(c.src) + c.n > *end) {
      return absl::InvalidArgumentError(absl::StrCat("copy of ", c.n, " bytes leaves its allocation"));
    }
    return absl::OkStatus();
  }

 private:
  uintptr_t next_ = uintptr_t{1} << 40;
  std::map<uintptr_t, size_t> allocations_;
};

// Feeds `pieces` to a coalescer over `space` and returns the copies it issued.
std::vector<DeviceCopy> Coalesce(const FakeAddressSpace& space, const std::vector<DeviceCopy>& pieces,
                                 size_t max_copy_bytes = 64 * kMiB) {
  CopyCoalescer coalescer([&space](int device, const char* p) { return space.End(device, p); },
                          max_copy_bytes);
  std::vector<DeviceCopy> issued;
  for (const DeviceCopy& p : pieces) {
    if (auto ready = coalescer.Add(p)) issued.push_back(*ready);
  }
  if (auto ready = coalescer.Flush()) issued.push_back(*ready);
  return issued;
}

// Pieces of `piece` bytes covering [src, src+n) into [dst, dst+n).
void Walk(std::vector<DeviceCopy>* pieces, char* dst, const char* src, size_t n, size_t piece) {
  for (size_t done = 0; done < n; done += piece) {
    pieces->push_back(DeviceCopy{dst + done, src + done, std::min(piece, n - done), 0});
  }
}

TEST(CopyCoalescerTest, AdjacentAllocationsAreNeverCopiedInOne) {
  FakeAddressSpace space;
  // Two tensors in two segments that touch in virtual memory, staged one
  // after the other into contiguous host memory (as two records of one
  // shard with no padding between them are).
  const char* a = space.Allocate(4 * kMiB);
  const char* b = space.Allocate(4 * kMiB);
  ASSERT_EQ(a + 4 * kMiB, b);
  std::vector<char> host(8 * kMiB);
  std::vector<DeviceCopy> pieces;
  Walk(&pieces, host.data(), a, 4 * kMiB, 512 * 1024);
  Walk(&pieces, host.data() + 4 * kMiB, b, 4 * kMiB, 512 * 1024);

  std::vector<DeviceCopy> copies = Coalesce(space, pieces);
  for (const DeviceCopy& c : copies) EXPECT_TRUE(space.Copy(c).ok()) << space.Copy(c);
  ASSERT_EQ(copies.size(), 2u);
  EXPECT_EQ(copies[0].src, a);
  EXPECT_EQ(copies[0].n, 4 * kMiB);
  EXPECT_EQ(copies[1].src, b);
  EXPECT_EQ(copies[1].n, 4 * kMiB);
}

TEST(CopyCoalescerTest, PiecesOfOneAllocationBecomeOneCopy) {
  FakeAddressSpace space;
  // Two tensors inside one segment (the caching allocator splits blocks):
  // continuing source and destination merge across the tensor boundary.
  const char* segment = space.Allocate(20 * kMiB);
  std::vector<char> host(12 * kMiB);
  std::vector<DeviceCopy> pieces;
  Walk(&pieces, host.data(), segment, 6 * kMiB, 512 * 1024);
  Walk(&pieces, host.data() + 6 * kMiB, segment + 6 * kMiB, 6 * kMiB, 64 * 1024);

  std::vector<DeviceCopy> copies = Coalesce(space, pieces);
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].n, 12 * kMiB);
  EXPECT_TRUE(space.Copy(copies[0]).ok());
}

TEST(CopyCoalescerTest, AGapInEitherAddressStartsANewCopy) {
  FakeAddressSpace space;
  const char* segment = space.Allocate(8 * kMiB);
  std::vector<char> host(8 * kMiB);
  // Destination gap (padding between records), then a source gap.
  std::vector<DeviceCopy> pieces = {
      {host.data(), segment, kMiB, 0},
      {host.data() + 2 * kMiB, segment + kMiB, kMiB, 0},
      {host.data() + 3 * kMiB, segment + 3 * kMiB, kMiB, 0},
  };
  std::vector<DeviceCopy> copies = Coalesce(space, pieces);
  ASSERT_EQ(copies.size(), 3u);
}

TEST(CopyCoalescerTest, AnotherDeviceStartsANewCopy) {
  FakeAddressSpace space;
  const char* segment = space.Allocate(2 * kMiB);
  std::vector<char> host(2 * kMiB);
  std::vector<DeviceCopy> pieces = {{host.data(), segment, kMiB, 0},
                                    {host.data() + kMiB, segment + kMiB, kMiB, 1}};
  EXPECT_EQ(Coalesce(space, pieces).size(), 2u);
}

TEST(CopyCoalescerTest, LongRunsAreCutAtTheCap) {
  FakeAddressSpace space;
  const char* segment = space.Allocate(40 * kMiB);
  std::vector<char> host(40 * kMiB);
  std::vector<DeviceCopy> pieces;
  Walk(&pieces, host.data(), segment, 40 * kMiB, kMiB);
  std::vector<DeviceCopy> copies = Coalesce(space, pieces, /*max_copy_bytes=*/16 * kMiB);
  ASSERT_EQ(copies.size(), 3u);
  EXPECT_EQ(copies[0].n, 16 * kMiB);
  EXPECT_EQ(copies[1].n, 16 * kMiB);
  EXPECT_EQ(copies[2].n, 8 * kMiB);
}

TEST(CopyCoalescerTest, AnAddressTheDriverCannotPlaceIsNeverMerged) {
  FakeAddressSpace space;
  // Memory the fake does not know (as `cuMemGetAddressRange` fails on host
  // or unknown pointers): each piece is its own copy.
  static char unknown[2 * kMiB];
  std::vector<char> host(2 * kMiB);
  std::vector<DeviceCopy> pieces = {{host.data(), unknown, kMiB, 0},
                                    {host.data() + kMiB, unknown + kMiB, kMiB, 0}};
  EXPECT_EQ(Coalesce(space, pieces).size(), 2u);
}

}  // namespace
}  // namespace ckpt::internal
