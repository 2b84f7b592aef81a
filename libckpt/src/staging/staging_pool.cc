#include "staging/staging_pool.h"

#include <algorithm>
#include <cstdlib>
#include <functional>

#include "absl/strings/str_cat.h"
#include "util/log.h"

namespace ckpt::internal {

StagingPool::~StagingPool() {
  MutexLock lock(&mu_);
  if (base_ != nullptr) UnpinHostMemory(base_, memory_.capacity(), pin_);
}

absl::Status StagingPool::Resize(size_t chunks, IoQueue* queue, Preparation preparation) {
  MutexLock lock(&mu_);
  if (free_.size() != count_) {
    return absl::InternalError("staging pool resized while chunks are in use");
  }
  if (base_ != nullptr) {
    if (queue != nullptr && registered_) (void)queue->RegisterBuffers({});
    UnpinHostMemory(base_, memory_.capacity(), pin_);
    memory_ = AlignedBytes();
    base_ = nullptr;
    count_ = 0;
    free_.clear();
    is_free_.clear();
  }
  const bool pinned = preparation == Preparation::kPinned;
  auto memory = AlignedBytes::Allocate(chunks * chunk_bytes_, /*prefault=*/pinned);
  if (!memory.ok()) return memory.status();
  memory_ = std::move(*memory);
  base_ = static_cast<char*>(memory_.data());
  pin_ = PinKind::kNone;
  registered_ = false;
  prepared_ = false;
  count_ = chunks;
  free_.reserve(chunks);
  for (size_t i = 0; i < chunks; ++i) free_.push_back(i);  // ascending: a min-heap
  is_free_.assign(chunks, true);
  if (pinned) PinLocked(queue);
  Log(LogLevel::kDebug, absl::StrCat("staging pool: ", chunks, " x ", chunk_bytes_ >> 10,
                                     " KiB, ", pinned ? PinKindName(pin_) : "not yet pinned",
                                     registered_ ? ", registered with io_uring" : ""));
  return absl::OkStatus();
}

absl::Status StagingPool::Pin(IoQueue* queue) {
  MutexLock lock(&mu_);
  if (free_.size() != count_) return absl::InternalError("staging pool pinned while chunks are in use");
  if (!prepared_) PinLocked(queue);
  return absl::OkStatus();
}

void StagingPool::PinLocked(IoQueue* queue) {
  pin_ = PinHostMemory(base_, memory_.capacity());
  if (queue != nullptr) {
    std::vector<std::span<char>> buffers(count_);
    for (size_t i = 0; i < count_; ++i) buffers[i] = {chunk(i), chunk_bytes_};
    absl::Status registered = queue->RegisterBuffers(buffers);
    registered_ = registered.ok();
    if (!registered.ok() && registered.code() != absl::StatusCode::kUnimplemented) {
      Log(LogLevel::kDebug, absl::StrCat("staging buffers not registered: ", registered.message()));
    }
  }
  prepared_ = true;
}

PinKind StagingPool::pin_kind() const {
  MutexLock lock(&mu_);
  return pin_;
}

bool StagingPool::pinned() const {
  MutexLock lock(&mu_);
  return prepared_;
}

std::optional<size_t> StagingPool::Acquire(const std::atomic<bool>* stop) {
  MutexLock lock(&mu_);
  const auto stopped = [stop] { return stop != nullptr && stop->load(); };
  mu_.Await([&] { return cancelled_ || stopped() || !free_.empty(); });
  if (cancelled_ || stopped()) return std::nullopt;
  return TakeLowest();
}

std::optional<size_t> StagingPool::TryAcquire() {
  MutexLock lock(&mu_);
  if (cancelled_ || free_.empty()) return std::nullopt;
  return TakeLowest();
}

size_t StagingPool::TakeLowest() {
  std::pop_heap(free_.begin(), free_.end(), std::greater<>());
  const size_t c = free_.back();
  free_.pop_back();
  is_free_[c] = false;
  return c;
}

void StagingPool::Release(size_t chunk) {
  MutexLock lock(&mu_);
  if (chunk >= count_ || is_free_[chunk]) {
    // Two owners of one chunk would stage two pieces of data into it: a
    // checkpoint whose checksums match wrong bytes. Never carry on.
    Log(LogLevel::kError, absl::StrCat("staging chunk ", chunk, " released twice (or unknown; ",
                                       count_, " chunks): aborting"));
    std::abort();
  }
  is_free_[chunk] = true;
  free_.push_back(chunk);
  std::push_heap(free_.begin(), free_.end(), std::greater<>());
}

void StagingPool::WakeWaiters() {
  MutexLock lock(&mu_);  // unlocking wakes every waiter
}

void StagingPool::Cancel() {
  MutexLock lock(&mu_);
  cancelled_ = true;
}

size_t StagingPool::count() const {
  MutexLock lock(&mu_);
  return count_;
}

size_t StagingPool::free_count() const {
  MutexLock lock(&mu_);
  return free_.size();
}

}  // namespace ckpt::internal
