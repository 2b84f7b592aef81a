// ckpt/engine.h: writes checkpoints into a root directory, in the background.
//
//   ckpt::EngineOptions options;
//   auto engine = ckpt::Engine::Open("/ckpt/run1", options);
//   ...
//   // In the training loop, every N steps:
//   auto handle = (*engine)->SaveAsync(step, tensors, R"({"epoch": 3})");
//   if (!handle.ok()) return handle.status();   // e.g. an earlier save failed
//   // Returns once the tensors are copied into staging memory: the caller may
//   // mutate them now. The shard files are written and committed behind it.
//   ...
//   absl::Status durable = (*handle)->Wait();   // committed, or why not
//
// A save is atomic: when it commits, `ROOT/step-<step>` is complete, fsynced
// and visible; when it fails (or the process dies), no part of it is visible
// and earlier checkpoints are untouched.
#ifndef CKPT_ENGINE_H_
#define CKPT_ENGINE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "ckpt/kinds.h"
#include "ckpt/options.h"
#include "ckpt/tensor.h"
#include "ckpt/tier.h"

namespace ckpt {

// What one save did. Times are seconds.
struct SaveStats {
  int64_t step = 0;
  std::string dir;              // the committed checkpoint directory
  bool skipped = false;         // dropped by `BusyPolicy::kSkip`; nothing was written
  std::optional<CheckpointKind> kind;  // once committed
  uint64_t tensor_bytes = 0;    // sum of the tensors' sizes
  uint64_t file_bytes = 0;      // bytes of shard files on disk
  size_t tensor_count = 0;
  size_t shard_count = 0;
  double blocked_s = 0;         // how long `SaveAsync` held the caller
  // CPU time the caller's thread used inside `SaveAsync`. Well below
  // `blocked_s`, the thread waited: for staging memory (`staging_wait_s`), or
  // descheduled by other load on the machine.
  double blocked_cpu_s = 0;
  double staging_s = 0;         // copying into staging memory (hashing is done by the writer)
  double staging_wait_s = 0;    // part of staging spent waiting for free staging memory
  // The staging memory this save was copied into: "cudaHostRegister",
  // "mlock", or "pageable" — the save found the pool too small and grew it
  // unpinned rather than make its caller wait for pinning (see
  // `EngineOptions::staging_reserve_bytes`); empty for a skipped save.
  std::string staging_memory;
  double persist_s = 0;         // from the save's first write to its commit
  double seconds = 0;           // from `SaveAsync` to commit
  double persist_gbps = 0;      // file_bytes / persist_s, in 1e9 bytes per second
  std::string backend;          // e.g. "io_uring+O_DIRECT"
  // A multi-rank save (ckpt/distributed.h): the figures above are this
  // rank's part. `ranks_wait_s`: from this rank's part being durable until
  // every part was (rank 0) or until rank 0's decision (the others).
  // `commit_latency_s`: rank 0, from the last part being durable to the
  // commit done; the others, from their part being durable to learning it.
  int rank = 0;
  int world_size = 1;
  double ranks_wait_s = 0;
  double commit_latency_s = 0;
};

// Totals over an engine's life.
struct EngineStats {
  uint64_t saves_started = 0;
  uint64_t saves_committed = 0;
  uint64_t saves_failed = 0;
  uint64_t saves_skipped = 0;
  uint64_t bytes_committed = 0;
  uint64_t watchdog_stalls = 0;   // saves reported for `watchdog_timeout`
  uint64_t saves_given_up = 0;    // saves failed for `stall_timeout`
  size_t saves_in_flight = 0;
  size_t staging_bytes = 0;       // size of the staging pool now
  size_t staging_bytes_free = 0;
  std::string staging_memory;     // "cudaHostRegister", "mlock" or "pageable"
  // Saves that found the staging pool too small and grew it unpinned (the
  // pool is then pinned in the background); 0 once it is reserved ahead.
  uint64_t saves_staged_unpinned = 0;
  std::string backend;            // the engine's I/O, e.g. "io_uring+O_DIRECT"
  SaveStats last;                 // the last save that finished (any outcome)
};

// One save in flight. Thread-safe; cheap to share.
class SaveHandle {
 public:
  virtual ~SaveHandle() = default;
  virtual int64_t step() const = 0;
  // Blocks until the tensors' bytes are in staging memory (or in the GPU's
  // copy queue ordered before the caller's later work — see TensorView):
  // after it returns the caller may mutate them. Returns the save's error if
  // staging failed; OK for a skipped save.
  virtual absl::Status WaitStaged() = 0;
  // Blocks until the checkpoint is durably committed, or returns why not.
  // OK for a skipped save: check `skipped()`.
  virtual absl::Status Wait() = 0;
  // True once the save committed, failed, or was skipped. Never blocks.
  virtual bool Done() const = 0;
  virtual bool skipped() const = 0;
  // The save's figures; complete once `Done()`.
  virtual SaveStats stats() const = 0;
};

class Engine {
 public:
  // Opens (creating if allowed) the checkpoint root `root`, probes the I/O
  // backend, starts the background threads, and allocates the staging pool
  // when `options.staging_bytes` fixes its size. Errors: ROOT is not a
  // directory, cannot be created, or a forced backend is refused.
  static absl::StatusOr<std::unique_ptr<Engine>> Open(const std::string& root,
                                                      const EngineOptions& options);
  // Waits for saves in flight (like `Close(CloseMode::kWait)`).
  virtual ~Engine() = default;

  // Starts saving checkpoint `step` of `tensors` with `extras_json` (a JSON
  // object stored in the manifest; readers get it back as compact JSON with
  // the same members and values, not byte-for-byte). Returns after staging (eager
  // mode) or at once (`EngineOptions::lazy_staging`: the copy runs in the
  // background; call `WaitStaged()` before mutating the tensors).
  //
  // Fails at once, writing nothing, on invalid input (a duplicate, empty,
  // NUL-bearing or non-UTF-8 name, a shape that does not match the byte
  // size, an unknown dtype, a negative step, a step that already exists or
  // is already being saved, extras that are not a JSON object), after
  // `Close`, or when an earlier save failed and that error was not yet
  // reported by its handle's `Wait` (the error is returned once, then
  // cleared). Saves commit in the order they were started.
  // Thread-safe.
  virtual absl::StatusOr<std::shared_ptr<SaveHandle>> SaveAsync(
      int64_t step, std::span<const TensorView> tensors, absl::string_view extras_json = "{}") = 0;

  // `SaveAsync` then `Wait`: returns once the checkpoint is durable.
  virtual absl::StatusOr<SaveStats> Save(int64_t step, std::span<const TensorView> tensors,
                                         absl::string_view extras_json = "{}") = 0;

  // Grows the staging pool to what a save of `tensors` needs, on a
  // background thread, so that the first save of that size does not pay for
  // allocating, first-touching and pinning the memory (0.3-0.8 s per GB
  // measured, more on some VMs) while its caller waits, and stages into
  // pinned memory at once. Only names and sizes are used: the tensors'
  // data is not read. Returns at once unless `wait` (then it returns the
  // reservation's outcome); a `SaveAsync` that arrives meanwhile waits for
  // the rest of the reservation. A reservation starts once no save is in
  // flight. Does nothing when `EngineOptions::staging_bytes` fixes the pool
  // or the pool is large enough already. If it fails (out of memory), the
  // next save tries to allocate again and reports the error.
  virtual absl::Status ReserveStaging(std::span<const TensorView> tensors, bool wait = false) = 0;

  enum class CloseMode {
    kWait,    // finish every save in flight
    kCancel,  // abandon saves in flight: their temp directories are removed
  };
  // Stops the engine. Returns the first background error no handle
  // reported. Later calls do nothing and return OK. With a tier
  // (`EngineOptions::tier`), kWait also waits until every committed save is
  // uploaded (or failed to be); kCancel drops the uploads not started and
  // ends the one in progress at its next wait.
  virtual absl::Status Close(CloseMode mode = CloseMode::kWait) = 0;

  virtual EngineStats stats() const = 0;
  // The uploads behind the save (`EngineOptions::tier`); null without a
  // tier. Valid as long as the engine, after `Close` too.
  virtual const TierUploader* tier() const = 0;
  virtual const std::string& root() const = 0;
  // The backend chosen at `Open`, e.g. "io_uring+O_DIRECT" or "threads+buffered".
  virtual absl::string_view backend() const = 0;
};

}  // namespace ckpt

#endif  // CKPT_ENGINE_H_
