// `RequestWindow`: how many requests an object store client keeps in flight
// at once, adapted to the store's answers the way TCP adapts its window
// (additive increase, multiplicative decrease): a throttled answer (503
// SlowDown, 429) sets the window to half the requests in flight, once per
// window's worth of requests -- the throttled answers of requests sent
// before the last halving do not halve it again -- down to 1; each other answer widens it by 1/window, up
// to its maximum. So a store that throttles gets fewer parallel requests,
// instead of the same number retrying in step; one that does not is never
// held back (the window starts at its maximum).
#ifndef CKPT_OBJECT_REQUEST_WINDOW_H_
#define CKPT_OBJECT_REQUEST_WINDOW_H_

#include <algorithm>
#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "util/mutex.h"

namespace ckpt::internal {

class RequestWindow {
 public:
  explicit RequestWindow(int max) : max_(max < 1 ? 1 : max), window_(max_) {}

  // One request's place in the window: taken by `Acquire` (waiting while
  // the window is full), given back by `Release` with how it was answered.
  struct Slot {
    uint64_t epoch = 0;  // the halvings before it was sent
  };
  Slot Acquire() {
    MutexLock lock(&mu_);
    mu_.Await([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return HasRoom(); });
    ++in_flight_;
    return Slot{halvings_};
  }
  // Acquire without waiting: false if the window is full.
  bool TryAcquire(Slot* slot) {
    MutexLock lock(&mu_);
    if (!HasRoom()) return false;
    ++in_flight_;
    *slot = Slot{halvings_};
    return true;
  }
  void Release(Slot slot, bool throttled) {
    MutexLock lock(&mu_);
    const double flight = in_flight_;  // this request included
    --in_flight_;
    if (throttled) {
      // The first throttled answer since the last halving: half of what was
      // in flight (the window may be far wider than what callers send).
      if (slot.epoch == halvings_) {
        window_ = std::max(1.0, std::min(window_, flight) / 2);
        ++halvings_;
      }
    } else if (window_ < max_) {
      window_ += 1 / window_;
      if (window_ > max_) window_ = max_;
    }
  }

  double window() const {
    MutexLock lock(&mu_);
    return window_;
  }
  uint64_t halvings() const {
    MutexLock lock(&mu_);
    return halvings_;
  }

 private:
  bool HasRoom() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return in_flight_ < static_cast<int>(window_); }

  const double max_;
  mutable Mutex mu_;
  double window_ ABSL_GUARDED_BY(mu_);
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t halvings_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ckpt::internal

#endif  // CKPT_OBJECT_REQUEST_WINDOW_H_
