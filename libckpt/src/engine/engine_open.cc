// `Engine::Open` and the engine's life: checking the options, taking the
// root, starting the threads, and `Close`.
#include <algorithm>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "ckpt/engine.h"
#include "ckpt/object_store.h"
#include "ckpt/maintenance.h"
#include "ckpt/root_lock.h"
#include "distributed/rank_layout.h"
#include "engine/engine_impl.h"
#include "format/names.h"
#include "io/backend.h"
#include "io/small_file.h"
#include "util/background_thread.h"
#include "ckpt/version.h"
#include "util/log.h"
#include "util/status_macros.h"

namespace ckpt {
namespace internal {
namespace {

// What manifests record as their writer: "ckpt <version>".
std::string WriterName() { return absl::StrCat("ckpt ", Version()); }

// How ckpt-retain names itself in the writer lock's owner line (tools/retain
// takes it to prove no writer is alive), and how long an open waits for it.
constexpr char kRetainHolder[] = "ckpt-retain, pid ";
constexpr absl::Duration kRetainWriterLockWait = absl::Seconds(10);

// Reclaims what dead jobs left in `root` (REQUIRES: the writer lock is
// held): every `.tmp-step-*` (each save in progress would be this writer's),
// and, if no retention job runs beside it (its lock is free, and held for
// the sweep), the trash, temps and set-asides of dead compactions, copies
// and removals too. Only listing `root` fails; the rest is logged.
absl::Status ReclaimOrphansAtOpen(const std::shared_ptr<FileSystem>& fs, const std::string& root) {
  ReclaimScope scope;
  scope.save_temps = true;
  auto retention = LockRoot(root, RootLockKind::kRetention, "ckpt engine (reclaiming orphans)", fs.get());
  if (retention.ok()) {
    scope.job_debris = true;
    scope.probe_min_age = absl::ZeroDuration();  // only this writer probes ROOT, and not yet
  } else if (absl::IsUnavailable(retention.status())) {
    Log(LogLevel::kInfo, absl::StrCat("leaving the trash and compaction/copy temps of ", root,
                                      " alone: a retention job owns them (",
                                      retention.status().message(), ")"));
  } else {
    Log(LogLevel::kWarning, absl::StrCat("leaving the trash and compaction/copy temps of ", root,
                                         " alone: ", retention.status().message()));
  }
  return ReclaimOrphans(root, scope, fs).status();
}

}  // namespace

CompressionOptions EffectiveCompression(const EngineOptions& options) {
  CompressionOptions c = options.compression;
  if (c.codec == CompressionCodec::kNone && options.compression_level > 0) {
    c.codec = CompressionCodec::kZstd;
    c.level = options.compression_level;
  }
  if (c.level == 0) c.level = options.compression_level > 0 ? options.compression_level : 1;
  return c;
}

EngineImpl::EngineImpl(std::string root, EngineOptions options, std::shared_ptr<FileSystem> fs,
                       std::unique_ptr<FileLock> writer_lock, OpenedIo backend,
                       std::unique_ptr<RankCommitter> committer)
    : root_(std::move(root)),
      options_(std::move(options)),
      fs_(std::move(fs)),
      writer_lock_(std::move(writer_lock)),
      committer_(std::move(committer)),
      backend_(std::move(backend)),
      pool_(options_.io.chunk_bytes),
      metrics_(fs_.get(), options_.metrics_jsonl_path, options_.prometheus_textfile_path) {}

absl::Status EngineImpl::Start() {
  if (options_.staging_bytes > 0) {
    const size_t chunks = std::max<size_t>(
        2, (options_.staging_bytes + options_.io.chunk_bytes - 1) / options_.io.chunk_bytes);
    CKPT_RETURN_IF_ERROR(pool_.Resize(chunks, backend_.queue.get()));
  } else if (options_.staging_reserve_bytes > 0) {
    const size_t chunks = (options_.staging_reserve_bytes + options_.io.chunk_bytes - 1) /
                              options_.io.chunk_bytes +
                          (options_.delta.mode != DeltaOptions::Mode::kNone ? 2 : 0);
    CKPT_RETURN_IF_ERROR(ScheduleReservation(chunks).status());
  }
  PersisterContext ctx{fs_.get(),        backend_.queue.get(),
                       &pool_,           root_,
                       backend_.direct,  backend_.description,
                       WriterName(),     options_.io,
                       EffectiveCompression(options_),
                       options_.delta,   options_.io.encode_buffers,
                       BackgroundNice(), committer_.get()};
  persister_ = std::make_unique<Persister>(ctx, [this](SaveJob& job, const absl::Status& outcome, const SaveStats& s) {
                               OnSaveDone(job, outcome, s);
                             });
  if (options_.lazy_staging) {
    lazy_ = std::make_unique<LazyStager>(&pool_);
  } else {
    host_copier_ = std::make_unique<ParallelCopier>(
        options_.staging_threads > 0 ? options_.staging_threads : ParallelCopier::DefaultThreads());
  }
  // (Always: it also enforces a preemption deadline.)
  watchdog_ = std::thread([this] {
    BecomeBackgroundThread("ckpt-watchdog", 0);
    Watch();
  });
  return absl::OkStatus();
}

EngineImpl::~EngineImpl() {
  absl::Status s = Close(CloseMode::kWait);
  if (!s.ok()) {
    Log(LogLevel::kError, absl::StrCat("engine for ", root_,
                                       " destroyed with an unreported save error: ", s.message()));
  }
}

absl::Status EngineImpl::Close(CloseMode mode) {
  {
    MutexLock lock(&mu_);
    if (closed_) return absl::OkStatus();
    closed_ = true;
    if (mode == CloseMode::kCancel) {
      for (auto& job : inflight_) job->Abort(absl::CancelledError("save cancelled: engine closing"));
    }
  }
  if (mode == CloseMode::kCancel) pool_.Cancel();
  if (lazy_ != nullptr) lazy_->Stop();
  for (std::thread& t : TakeReservations()) t.join();
  MutexLock staging_lock(&staging_mu_);  // no save is staging past this point
  if (persister_ != nullptr) persister_->Stop(mode == CloseMode::kCancel);  // (null: Start failed first)
  std::vector<SaveStats> skipped;
  {
    MutexLock lock(&mu_);
    watchdog_stop_ = true;
    skipped.swap(skipped_unlogged_);
  }
  LogSkipped(skipped);  // the persister has stopped: this thread has the metrics sink
  if (watchdog_.joinable()) watchdog_.join();
  // Every save's outcome is in: upload what committed (or drop it).
  if (tier_ != nullptr) tier_->Close(mode == CloseMode::kCancel);
  writer_lock_.reset();  // nothing of this engine writes any more: another may open ROOT
  return TakeUnreportedError();
}

int EngineImpl::BackgroundNice() const {
  if (options_.background_nice >= 0) return options_.background_nice;
  const bool encodes = options_.delta.mode != DeltaOptions::Mode::kNone ||
                       EffectiveCompression(options_).codec != CompressionCodec::kNone;
  return encodes ? 10 : 0;
}

absl::Status ValidateEngineOptions(const EngineOptions& options) {
  if (options.shard_min_bytes > options.shard_max_bytes) {
    return absl::InvalidArgumentError("shard_min_bytes is larger than shard_max_bytes");
  }
  if (options.delta.mode == DeltaOptions::Mode::kTopK &&
      !(options.delta.topk_ratio > 0 && options.delta.topk_ratio <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("delta.topk_ratio ", options.delta.topk_ratio, " is not in (0, 1]"));
  }
  if (options.delta.full_every < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("delta.full_every ", options.delta.full_every, " must be at least 1"));
  }
  if (options.staging_threads < 0 || options.staging_threads > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("staging_threads ", options.staging_threads, " is not in 0..64"));
  }
  if (options.background_nice < -1 || options.background_nice > 19) {
    return absl::InvalidArgumentError(absl::StrCat(
        "background_nice ", options.background_nice, " is not in 0..19 (or -1: automatic)"));
  }
  if (options.io.encode_buffers < 1) {
    return absl::InvalidArgumentError("io.encode_buffers must be at least 1");
  }
  if (options.compression_level < 0 || options.compression_level > 19) {
    return absl::InvalidArgumentError(
        absl::StrCat("compression_level ", options.compression_level, " is not in 0..19"));
  }
  if (options.compression.level < 0 || options.compression.level > 19) {
    return absl::InvalidArgumentError(
        absl::StrCat("compression.level ", options.compression.level, " is not in 0..19"));
  }
  if (options.compression.threads < 0 || options.compression.threads > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("compression.threads ", options.compression.threads, " is not in 0..64"));
  }
  if (!(options.delta.max_restore_read_factor == 0 || options.delta.max_restore_read_factor >= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "delta.max_restore_read_factor ", options.delta.max_restore_read_factor,
        " must be 0 (no bound) or at least 1 (a restore reads the full save at least)"));
  }
  const DistributedOptions& dist = options.distributed;
  if (dist.world_size < 1 || dist.world_size > kMaxWorldSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("distributed.world_size ", dist.world_size, " is not in 1..", kMaxWorldSize));
  }
  if (dist.world_size > 1) {
    if (dist.rank < 0 || dist.rank >= dist.world_size) {
      return absl::InvalidArgumentError(absl::StrCat("distributed.rank ", dist.rank, " is not in 0..",
                                                     dist.world_size - 1));
    }
    if (dist.store == nullptr) {
      return absl::InvalidArgumentError("distributed.store is required when world_size > 1");
    }
    if (dist.key_prefix.empty()) return absl::InvalidArgumentError("distributed.key_prefix is empty");
    if (dist.commit_timeout <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError("distributed.commit_timeout must be positive");
    }
    if (options.when_busy == EngineOptions::BusyPolicy::kSkip) {
      return absl::InvalidArgumentError(
          "when_busy=skip cannot be used with world_size > 1: ranks would skip different saves");
    }
  }
  if (!options.tier.url.empty()) CKPT_RETURN_IF_ERROR(ValidateTierOptions(options.tier));
  return absl::OkStatus();
}

}  // namespace internal

absl::StatusOr<std::unique_ptr<Engine>> Engine::Open(const std::string& root,
                                                     const EngineOptions& options) {
  using namespace internal;  // NOLINT: the engine is the glue of the internals
  if (root.empty()) return absl::InvalidArgumentError("checkpoint root is empty");
  if (IsObjectUrl(root)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot save to ", root, ": saves go to a local (or mounted) directory, whose rename and "
        "fsync are the commit; move checkpoints to the bucket with `ckpt-retain --root DIR "
        "--cold-dir ", root, "`, and restore from it with ckpt-restore --root / ckpt.load"));
  }
  std::shared_ptr<FileSystem> fs = options.fs != nullptr ? options.fs : PosixFileSystem();
  CKPT_RETURN_IF_ERROR(ValidateEngineOptions(options));
  const DistributedOptions& dist = options.distributed;
  const bool multi_rank = dist.world_size > 1;
  auto stat = fs->Stat(root);
  if (!stat.ok() && stat.status().code() == absl::StatusCode::kNotFound && options.create_root) {
    // Another process (another rank) may create it at the same time.
    absl::Status created = fs->CreateDir(root);
    if (!created.ok() && !absl::IsAlreadyExists(created)) return created;
    size_t slash = root.find_last_of('/');
    std::string parent = slash == std::string::npos ? "." : slash == 0 ? "/" : root.substr(0, slash);
    CKPT_RETURN_IF_ERROR(fs->SyncDir(parent));
    stat = fs->Stat(root);
  }
  if (!stat.ok()) return Annotate(stat.status(), "checkpoint root");
  if (!stat->is_directory) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint root ", root, " is not a directory"));
  }
  // One writer per root: a second engine, here or in another process, would
  // race this one's commits, LATEST and delta base. (Of a multi-rank
  // engine's ranks on a shared ROOT, rank 0 commits and holds the lock; the
  // others only write files of their own into the temp directories. Ranks
  // that share no file system each commit, and lock, a directory of their
  // own.)
  std::unique_ptr<FileLock> writer_lock;
  std::unique_ptr<RankCommitter> committer;
  if (multi_rank) {
    committer = std::make_unique<RankCommitter>(dist, fs.get(), root, WriterName());
  }
  if (!multi_rank || dist.rank == 0 || !dist.shared_root) {
    auto locked = LockRoot(root, RootLockKind::kWriter, "ckpt engine", fs.get());
    // ckpt-retain holds the writer lock only while it renames a dead
    // writer's save temps to trash (milliseconds): a trainer restarting at
    // that moment waits for it rather than failing.
    for (const absl::Time until = absl::Now() + kRetainWriterLockWait;
         !locked.ok() && absl::IsUnavailable(locked.status()) &&
         absl::StrContains(locked.status().message(), kRetainHolder) && absl::Now() < until;) {
      absl::SleepFor(absl::Milliseconds(20));
      locked = LockRoot(root, RootLockKind::kWriter, "ckpt engine", fs.get());
    }
    if (!locked.ok()) {
      if (locked.status().code() != absl::StatusCode::kUnavailable) return locked.status();
      return absl::UnavailableError(absl::StrCat(
          locked.status().message(), " (one engine writes a root at a time: close the other first)"));
    }
    writer_lock = std::move(*locked);
    // Holding the lock, every save in progress in ROOT is ours: a
    // `.tmp-step-*` directory there was left by a writer that died mid-save.
    CKPT_RETURN_IF_ERROR(ReclaimOrphansAtOpen(fs, root));
  }
  // Rank 0 publishes that ROOT is clean; the others wait for it.
  if (committer != nullptr) CKPT_RETURN_IF_ERROR(committer->Handshake());
  auto backend = OpenIo(*fs, options.io, root);
  if (!backend.ok()) return Annotate(backend.status(), absl::StrCat("checkpoint root ", root));
  auto engine = std::make_unique<EngineImpl>(root, options, fs, std::move(writer_lock),
                                             std::move(*backend), std::move(committer));
  if (!options.tier.url.empty()) {
    auto tier = BackgroundTier::Start(root, options.tier, fs, dist);
    if (!tier.ok()) return tier.status();
    engine->AttachTier(std::move(*tier));
  }
  CKPT_RETURN_IF_ERROR(engine->Start());
  return std::unique_ptr<Engine>(std::move(engine));
}

}  // namespace ckpt
