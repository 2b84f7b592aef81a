// The engine's staging pool: how many chunks a save needs, growing the pool
// for a save, and preparing it off the caller's thread (`ReserveStaging`,
// `EngineOptions::staging_reserve_bytes`, and pinning after a save grew it).
//
// Pinning costs ~0.3-0.8 s per GB (first touch, then page-locking for DMA),
// which a training loop must not wait for. So the pool is pinned ahead of
// the saves when told their size, and otherwise a save that finds the pool
// too small grows it unpinned (address space only: its copies touch the
// pages as they go) and the pool is pinned in the background once that
// save is written, for the next one.
#include <algorithm>
#include <future>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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

absl::StatusOr<bool> EngineImpl::SizePoolForSave(int64_t step, size_t needed, size_t in_flight) {
  if (in_flight > 0) return false;  // chunks are in use: this save streams through the pool
  const bool too_small = pool_.count() < 2 || (options_.staging_bytes == 0 && pool_.count() < needed);
  if (!too_small) return false;
  const size_t chunks = std::max<size_t>(needed, 2);
  CKPT_RETURN_IF_ERROR(pool_.Resize(chunks, backend_.queue.get(), StagingPool::Preparation::kUnpinned));
  const double gb = static_cast<double>(chunks * pool_.chunk_bytes()) / 1e9;
  Log(LogLevel::kInfo,
      absl::StrFormat("save of step %d in %s: staging memory grown to %.2f GB unpinned (pinning it "
                      "would have held the caller ~0.3-0.8 s per GB); it is pinned in the background "
                      "once this save is written. Reserve it ahead with "
                      "EngineOptions::staging_reserve_bytes or Engine::ReserveStaging.",
                      step, root_, gb));
  {
    MutexLock lock(&mu_);
    ++stats_.saves_staged_unpinned;
  }
  // (Fails only once the engine is closed; the next save would grow it again.)
  (void)ScheduleReservation(/*chunks=*/0);
  return true;
}

absl::Status EngineImpl::ReserveStaging(std::span<const TensorView> tensors, bool wait) {
  if (options_.staging_bytes > 0) return absl::OkStatus();  // fixed at Open
  // (A rank of a multi-rank engine stages only what it writes.)
  const size_t needed = StagingChunksFor(PlanShards(
      TensorsThisRankWrites(tensors), options_.shard_min_bytes, options_.shard_max_bytes));
  CKPT_ASSIGN_OR_RETURN(std::future<absl::Status> outcome, ScheduleReservation(needed));
  if (!wait) return absl::OkStatus();
  return outcome.get();
}

absl::StatusOr<std::future<absl::Status>> EngineImpl::ScheduleReservation(size_t chunks) {
  auto reservation = std::make_shared<std::promise<absl::Status>>();
  std::future<absl::Status> outcome = reservation->get_future();
  MutexLock lock(&mu_);
  if (closed_) return absl::FailedPreconditionError(absl::StrCat("engine for ", root_, " is closed"));
  ++reservations_pending_;
  reservations_.emplace_back([this, chunks, reservation] {
    BecomeBackgroundThread("ckpt-reserve", BackgroundNice());
    absl::Status s = Reserve(chunks);
    {
      MutexLock lock(&mu_);
      --reservations_pending_;
    }
    reservation->set_value(std::move(s));
  });
  return outcome;
}

void EngineImpl::AwaitReservations() {
  MutexLock lock(&mu_);
  // A reservation waiting for saves in flight holds nothing: a save started
  // meanwhile goes ahead (through the memory the pool has), and the
  // reservation runs once the saves have drained.
  mu_.Await([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closed_ || reservations_pending_ == 0 || !inflight_.empty();
  });
}

absl::Status EngineImpl::Reserve(size_t chunks) {
  // Waits for a moment when no save is in flight, then holds `staging_mu_`
  // so none starts while the pool changes. Never holds `staging_mu_` while
  // waiting: a lazy or skipping save must not wait for an earlier save's
  // writes because memory is to be pinned after it.
  std::optional<MutexLock> staging_lock;
  for (;;) {
    {
      MutexLock lock(&mu_);
      mu_.Await([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return closed_ || inflight_.empty(); });
      if (closed_) return absl::CancelledError("engine closed before staging memory was reserved");
    }
    staging_lock.emplace(&staging_mu_);
    MutexLock lock(&mu_);
    if (closed_) return absl::CancelledError("engine closed before staging memory was reserved");
    if (inflight_.empty()) break;
    staging_lock.reset();  // a save started in between: wait for it too
  }
  const Clock::time_point start = Clock::now();
  const bool grow = pool_.count() < chunks;
  if (!grow && pool_.pinned()) return absl::OkStatus();
  absl::Status s = grow ? pool_.Resize(chunks, backend_.queue.get()) : pool_.Pin(backend_.queue.get());
  if (!s.ok()) {
    Log(LogLevel::kWarning, absl::StrCat("reserving staging memory for ", root_, ": ", s.message()));
    return s;
  }
  Log(LogLevel::kInfo, absl::StrFormat("%s %d bytes of staging memory (%s) for %s in %.3f s",
                                       grow ? "reserved" : "pinned", pool_.count() * pool_.chunk_bytes(),
                                       PinKindName(pool_.pin_kind()), root_, SecondsSince(start)));
  return absl::OkStatus();
}

std::vector<std::thread> EngineImpl::TakeReservations() {
  MutexLock lock(&mu_);
  return std::move(reservations_);
}

}  // namespace ckpt::internal
