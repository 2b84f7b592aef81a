// The engine's staging pool: how many chunks a save needs, and growing the
// pool ahead of the saves (`ReserveStaging`).
#include <algorithm>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/engine_impl.h"
#include "util/background_thread.h"
#include "util/log.h"
#include "util/status_macros.h"

namespace ckpt::internal {
namespace {

size_t ChunksNeeded(const std::vector<PlannedShard>& plan, size_t chunk_bytes) {
  size_t n = 0;
  for (const PlannedShard& s : plan) n += (s.padded_bytes + chunk_bytes - 1) / chunk_bytes;
  return n;
}

}  // namespace

// Staging chunks a save of `plan` needs. Deltas hold a record's chunks
// until it is complete: two spare chunks let a record straddle chunk
// boundaries without starving the stager.
size_t EngineImpl::StagingChunksFor(const std::vector<PlannedShard>& plan) const {
  return ChunksNeeded(plan, pool_.chunk_bytes()) +
         (options_.delta.mode != DeltaOptions::Mode::kNone ? 2 : 0);
}

absl::Status EngineImpl::SizePoolForSave(size_t needed, size_t in_flight) {
  if (in_flight == 0 && (pool_.count() < 2 || (options_.staging_bytes == 0 && pool_.count() < needed))) {
    CKPT_RETURN_IF_ERROR(pool_.Resize(std::max<size_t>(needed, 2), backend_.queue.get()));
  }
  return absl::OkStatus();
}

absl::Status EngineImpl::ReserveStaging(std::span<const TensorView> tensors, bool wait) {
  if (options_.staging_bytes > 0) return absl::OkStatus();  // fixed at Open
  // (A rank of a multi-rank engine stages only what it writes.)
  const size_t needed = StagingChunksFor(PlanShards(
      TensorsThisRankWrites(tensors), options_.shard_min_bytes, options_.shard_max_bytes));
  auto reservation = std::make_shared<std::promise<absl::Status>>();
  std::future<absl::Status> outcome = reservation->get_future();
  {
    MutexLock lock(&mu_);
    if (closed_) return absl::FailedPreconditionError(absl::StrCat("engine for ", root_, " is closed"));
    reservations_.emplace_back([this, needed, reservation] {
      BecomeBackgroundThread("ckpt-reserve", BackgroundNice());
      reservation->set_value(Reserve(needed));
    });
  }
  if (!wait) return absl::OkStatus();
  return outcome.get();
}

absl::Status EngineImpl::Reserve(size_t chunks) {
  MutexLock staging_lock(&staging_mu_);
  {
    MutexLock lock(&mu_);
    mu_.Await([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return closed_ || inflight_.empty(); });
    if (closed_) return absl::CancelledError("engine closed before staging memory was reserved");
  }
  if (pool_.count() >= chunks) return absl::OkStatus();
  const Clock::time_point start = Clock::now();
  absl::Status s = pool_.Resize(chunks, backend_.queue.get());
  if (!s.ok()) {
    Log(LogLevel::kWarning, absl::StrCat("reserving staging memory for ", root_, ": ", s.message()));
    return s;
  }
  Log(LogLevel::kInfo, absl::StrCat("reserved ", chunks * pool_.chunk_bytes(), " bytes of staging memory in ",
                                    SecondsSince(start), " s"));
  return absl::OkStatus();
}

std::vector<std::thread> EngineImpl::TakeReservations() {
  MutexLock lock(&mu_);
  return std::move(reservations_);
}

}  // namespace ckpt::internal
