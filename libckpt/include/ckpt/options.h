// ckpt/options.h: knobs of the engine and the reader.
#ifndef CKPT_OPTIONS_H_
#define CKPT_OPTIONS_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include <string>

#include "absl/time/time.h"
#include "ckpt/distributed.h"
#include "ckpt/file_system.h"
#include "ckpt/tier.h"

namespace ckpt {

// How data reaches the disk. `kAuto` probes and logs what it chose.
enum class IoBackend : uint8_t {
  kAuto,     // io_uring if the kernel allows it, else kThreads
  kUring,    // io_uring; opening fails if it is refused
  kThreads,  // a thread pool calling pwrite/pread
};

// Whether shard files bypass the page cache.
enum class DirectIoMode : uint8_t {
  kAuto,  // O_DIRECT where the file system accepts it (probed per root)
  kOn,    // O_DIRECT; opening fails where it is refused
  kOff,   // buffered I/O
};

struct IoOptions {
  IoBackend backend = IoBackend::kAuto;
  DirectIoMode direct = DirectIoMode::kAuto;
  // Transfers in flight at once, across all shard files.
  size_t queue_depth = 32;
  // Size of one transfer; a multiple of 4 KiB.
  size_t chunk_bytes = size_t{1} << 20;
  // Readers only: the most host memory a reader's bounce buffers may use
  // (record tails, unaligned targets, `Verify`); allocated and pre-faulted on
  // first use: one `chunk_bytes` chunk per `queue_depth`, and no more than
  // the checkpoint needs.
  // Restoring delta chains, a reader also keeps an arena of up to twice
  // this (or the largest link) that it reads links into, and `Verify` of a
  // delta step rebuilds its tensors in groups of up to twice this.
  // (Saves stage through `EngineOptions::staging_bytes` instead.)
  size_t buffer_bytes = size_t{64} << 20;
  // Saves whose records are encoded (deltas, zstd, planes): output buffers of
  // `chunk_bytes` each that encoded bytes are gathered in before they are
  // written. Any number >= 1 completes every save (a shard holding a partly
  // filled buffer writes its whole blocks early when another needs it);
  // more lets more writes overlap the encoding.
  size_t encode_buffers = 8;
};

// Delta checkpoints: between full saves, store only what changed since the
// state a restore of the previous checkpoint yields (see docs/deltas.md).
struct DeltaOptions {
  enum class Mode : uint8_t {
    kNone,   // every save is full
    kExact,  // lossless: per tensor the smallest of changed elements (sparse), XOR, or
             // XOR grouped into byte planes, each zstd (see docs/deltas.md)
    kTopK,   // lossy: per tensor the ceil(topk_ratio * numel) largest changes
  };
  Mode mode = Mode::kNone;
  double topk_ratio = 0.01;
  // What a delta is taken against.
  enum class Base : uint8_t {
    // The last full save: every delta depends on that full checkpoint alone,
    // so a restore reads one full and one delta (Check-N-Run's scheme). The
    // default: with AdamW's dense changes it writes about as many bytes as
    // chained deltas and its restores read far fewer (bench/README.md).
    kDifferential,
    // The previous save (full or delta): each delta holds one interval's
    // changes, and a restore applies every delta since the last full save.
    kChained,
  };
  Base base = Base::kDifferential;
  // An upper bound on the interval between full saves: a full save at least
  // every `full_every` saves (the first save is always full, and so is any
  // save whose delta would not be smaller).
  int full_every = 10;
  // A full save is taken early when a restore of the next delta would read
  // more than this factor times the stored bytes of the last full save (the
  // full plus every delta it would apply, the next one predicted by the
  // previous one's size), so no restore reads more than that. 0: no bound
  // but `full_every`.
  double max_restore_read_factor = 2.5;
  // Host memory for the reference state (one copy of every tensor); tensors
  // that do not fit are saved in full in every save. SIZE_MAX: no bound.
  size_t max_reference_bytes = SIZE_MAX;
  // An engine opened on a root whose newest checkpoint it can read rebuilds
  // its reference state from it, on the background thread (the first save's
  // staging does not wait; its write does, until the rebuild is done), so
  // the first save after a restart can be a delta. Costs what the reference
  // state costs anyway (a host copy of the state) from `Open` on, and one
  // read of that checkpoint. A multi-rank engine's ranks each read their
  // own part and then agree through the store (within `commit_timeout`):
  // unless every rank rebuilt from the same checkpoint, the first save is
  // full on every rank (docs/distributed.md).
  bool resume_from_newest = true;
};

// How full records are compressed (`EngineOptions::compression`).
enum class CompressionCodec : uint8_t {
  kNone,    // raw records
  kZstd,    // each record zstd, level `compression_level`
  // Each record as byte planes (docs/format.md, "planes"): the bytes of its
  // elements grouped by significance, each plane zstd: smaller for floating
  // tensors (measured in bench/README.md, "Dense deltas, float compression"),
  // at encode speeds per core below a fast disk's: see `adaptive`.
  kPlanes,
};

struct CompressionOptions {
  CompressionCodec codec = CompressionCodec::kNone;
  // zstd level of records or planes (1..19); 0 means the codec's default (1).
  int level = 0;
  // kPlanes: store raw what does not pay — a tensor whose planes do not
  // shrink, and every block while the measured encode throughput (all
  // encoder threads) is below the measured write throughput, when
  // compressing would make the durable save slower (blocks are still
  // sampled, to follow changes in either). false: compress every block.
  bool adaptive = true;
  // Threads that encode (planes, and deltas' byte planes), the persister
  // included; 0: up to 8, no more than the cores the process may use.
  int threads = 0;
};

// The name of each option enum's values, as options, manifests and every
// printed form spell them (ckpt/options_json.h), and its inverse (nullopt
// for any other name).
// "none", "exact", "topk".
absl::string_view DeltaModeName(DeltaOptions::Mode mode);
std::optional<DeltaOptions::Mode> ParseDeltaMode(absl::string_view name);
// "differential", "chained".
absl::string_view DeltaBaseName(DeltaOptions::Base base);
std::optional<DeltaOptions::Base> ParseDeltaBase(absl::string_view name);
// "none", "zstd", "planes".
absl::string_view CompressionCodecName(CompressionCodec codec);
std::optional<CompressionCodec> ParseCompressionCodec(absl::string_view name);
// "auto", "uring", "threads".
absl::string_view IoBackendName(IoBackend backend);
std::optional<IoBackend> ParseIoBackend(absl::string_view name);
// "auto", "on", "off".
absl::string_view DirectIoModeName(DirectIoMode mode);
std::optional<DirectIoMode> ParseDirectIoMode(absl::string_view name);

struct EngineOptions {
  // Every file-system call goes through `fs`; null means `PosixFileSystem()`.
  std::shared_ptr<FileSystem> fs;
  IoOptions io;
  // Tensors are grouped into shard files by module (the name up to its last
  // '.' or '/'). Consecutive modules are merged into one shard until it holds
  // at least `shard_min_bytes`; a module larger than `shard_max_bytes` is
  // split (at tensor boundaries) into several shards.
  uint64_t shard_min_bytes = uint64_t{16} << 20;
  uint64_t shard_max_bytes = uint64_t{256} << 20;
  // Create the root directory (not its parents) when it does not exist.
  bool create_root = true;

  // Staging memory: host memory saves are copied into before they are
  // written. 0 (default): the pool grows to hold the largest save seen, so a
  // save never waits for memory unless another is still persisting; the
  // first save of a size pays for allocating and pre-faulting it. Otherwise
  // the pool has this fixed size (rounded to chunks), allocated at `Open`; a
  // larger save streams through it, blocking its caller until the rest is
  // written.
  size_t staging_bytes = 0;
  // (Staging memory is cut into chunks of `io.chunk_bytes`, the unit of
  // transfer to disk.)
  // A size hint (with `staging_bytes` 0): staging memory for saves of this
  // many bytes is allocated and pinned on a background thread at `Open`, so
  // the first save finds it ready (one that starts before it is ready waits
  // for the rest). The pool still grows when a save needs more. Without a
  // hint or `Engine::ReserveStaging`, a save that finds the pool too small
  // grows it unpinned and the pool is pinned after that save is written
  // (`SaveStats::staging_memory` says "pageable" for that save).
  size_t staging_reserve_bytes = 0;

  // What `SaveAsync` does when staging memory is held by earlier saves.
  enum class BusyPolicy : uint8_t {
    kWait,  // wait for memory (backpressure)
    kSkip,  // skip this save: the handle reports `skipped()`
  };
  BusyPolicy when_busy = BusyPolicy::kWait;
  // Return from `SaveAsync` at once and copy in the background.
  bool lazy_staging = false;
  // Eager saves of host tensors: false (default) holds the writes back until
  // the copy into staging memory is done (or staging memory runs short, when
  // a save is larger than the pool), so they do not compete with the copy the
  // caller is waiting for; the save becomes durable a copy's time later.
  // true starts writing chunks while the copy goes on: as each is staged
  // with one copy thread, and per batch of up to 32 MiB of copies with
  // several (so a save under 32 MiB is written once staged either way).
  // Lazy saves and saves of CUDA tensors always write as chunks are staged.
  bool write_during_eager_staging = false;
  // Threads that copy an eager save's host tensors into staging memory, the
  // caller included (its wait is that copy): one thread's memcpy is well
  // below what the memory system gives two or more. 0 (default): up to 4,
  // no more than the cores the process may use; 1: the caller alone. Lazy
  // saves copy on one background thread.
  int staging_threads = 0;

  // The engine's background threads (persister and encoder, staging
  // reservation) run this much nicer than the thread that opened the engine
  // (0..19; 0 = same priority), or -1 (default): 10 when the engine encodes
  // (deltas or compression: seconds of CPU per GB, which would slow a CPU-bound
  // training loop), 0 when it only writes raw shards (hashing and I/O
  // submission, ~0.15 CPU s per GB: niced, they would wait behind a busy
  // loop and the save would reach disk far later for nothing). The lazy
  // stager and the eager copy threads are never niced: the loop waits for
  // their copy before it changes the tensors. See docs/engine.md ("What the
  // background work costs the loop").
  int background_nice = -1;

  // zstd level for shard files (1..19), kept for existing callers: a level
  // > 0 with `compression.codec` kNone means kZstd at that level; with a
  // codec set and `compression.level` 0, it is that codec's level. 0 (the
  // default) leaves compression to `compression` (none unless a codec is set).
  int compression_level = 0;
  CompressionOptions compression;

  DeltaOptions delta;

  // A save that makes no progress (no chunk staged, written or encoded, no
  // commit step done) for this long is reported (log line,
  // `EngineStats::watchdog_stalls`, `on_stall`). Zero disables the warning.
  absl::Duration watchdog_timeout = absl::Minutes(5);
  // A save that makes no progress for this long is given up: it fails with
  // DEADLINE_EXCEEDED naming the stage it was stuck in (staging, encoding,
  // writing, commit), every waiter (`WaitStaged`, `Wait`, a caller blocked in
  // `SaveAsync` for staging memory, the next `SaveAsync`, `Close`) gets that
  // error at once, nothing is committed and its temp directory is removed
  // once the stuck call returns. A save whose manifest is durable has begun
  // its commit (renames and fsyncs) and is not given up (it is reported only). Zero disables. See docs/engine.md.
  absl::Duration stall_timeout = absl::Minutes(10);
  // Called (from the watchdog thread) with the stalled step and how long it
  // has made no progress. Must not call back into the engine.
  std::function<void(int64_t step, absl::Duration stalled_for)> on_stall;

  // Append one JSON object per finished save to this file (through `fs`).
  std::string metrics_jsonl_path;
  // Rewrite this Prometheus text file (node_exporter textfile collector
  // format) atomically after every save.
  std::string prometheus_textfile_path;

  // One checkpoint written by several processes (ckpt/distributed.h). The
  // default (world_size 1) is a single-process engine.
  DistributedOptions distributed;

  // Upload behind the save (ckpt/tier.h): with `tier.url` set, every
  // checkpoint this engine commits is then published to that bucket prefix
  // in the background, and `Engine::tier()` says per step whether it is
  // durable there. `Close(kWait)` waits for the uploads too.
  TierOptions tier;
};

// "wait", "skip".
absl::string_view BusyPolicyName(EngineOptions::BusyPolicy policy);
std::optional<EngineOptions::BusyPolicy> ParseBusyPolicy(absl::string_view name);

struct ReaderOptions {
  std::shared_ptr<FileSystem> fs;  // null means `PosixFileSystem()`
  IoOptions io;
  // The step to open; unset opens the newest committed checkpoint whose
  // manifest verifies.
  std::optional<int64_t> step;
  // A multi-rank checkpoint (ckpt/distributed.h): the part of rank `rank`
  // (its own tensors and every replicated one), or, unset, all of it: the
  // replicated tensors under their names and every rank's other tensors as
  // "rank<r>/<name>". A single-process checkpoint is rank 0's part alone
  // (any other rank is kNotFound).
  std::optional<int> rank;
};

}  // namespace ckpt

#endif  // CKPT_OPTIONS_H_
