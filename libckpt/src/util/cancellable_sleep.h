// `SleepUnlessCancelled`: a wait that a caller's cancellation flag can end
// early (an upload waiting to try again, or for a lease another job holds).
#ifndef CKPT_UTIL_CANCELLABLE_SLEEP_H_
#define CKPT_UTIL_CANCELLABLE_SLEEP_H_

#include <algorithm>
#include <functional>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace ckpt::internal {

// Sleeps `d` in slices of at most `slice`, polling `cancelled` (may be
// empty) before each and once after; false as soon as it returns true.
inline bool SleepUnlessCancelled(absl::Duration d, const std::function<bool()>& cancelled,
                                 absl::Duration slice = absl::Milliseconds(100)) {
  const auto stop = [&] { return cancelled && cancelled(); };
  for (const absl::Time until = absl::Now() + d; absl::Now() < until;) {
    if (stop()) return false;
    absl::SleepFor(std::min(slice, until - absl::Now()));
  }
  return !stop();
}

}  // namespace ckpt::internal

#endif  // CKPT_UTIL_CANCELLABLE_SLEEP_H_
