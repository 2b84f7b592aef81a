// `Persister`: a save's way from staged chunks to its commit, on one thread.
// (Over 400 lines: the writing of one save (`ChunkWriter`, one loop over the
// stager, the encoder and the I/O queue) sits beside the commit and failure
// paths, so the order of what a failed save undoes reads in one place.)
#include "engine/persister.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "commit/commit.h"
#include "commit/publish.h"
#include "delta/delta_codec.h"
#include "distributed/rank_layout.h"
#include "distributed/resume_agreement.h"
#include "engine/record_hasher.h"
#include "engine/reference_rebuild.h"
#include "engine/save_manifest.h"
#include "format/manifest.h"
#include "util/kill_point.h"
#include "format/names.h"
#include "io/io_executor.h"
#include "io/small_file.h"
#include "preemption/preemption_state.h"
#include "util/background_thread.h"
#include "util/hash.h"
#include "util/log.h"
#include "util/status_macros.h"

namespace ckpt::internal {
namespace {

// Tags of encoder output buffers carry this bit; staging chunks do not.
constexpr uint64_t kOutputTag = uint64_t{1} << 62;

// Why a save whose part is durable stops waiting for the other ranks: it
// was cancelled (Close), or the preemption grace ran out; OK while neither.
absl::Status ReasonToGiveUp(const SaveJob& job) {
  if (job.abort.load()) {
    absl::Status why = job.abort_reason();
    return why.ok() ? absl::CancelledError("save cancelled") : why;
  }
  if (PreemptionDeadlinePassed()) {
    return absl::DeadlineExceededError(absl::StrCat(
        PreemptionGraceRanOut(), "; nothing committed, the previous checkpoint stays the latest"));
  }
  return absl::OkStatus();
}

}  // namespace

Persister::Persister(PersisterContext context, DoneFn on_done)
    : ctx_(std::move(context)), on_done_(std::move(on_done)), adaptive_(ctx_.compression.adaptive) {
  if (ctx_.delta.mode != DeltaOptions::Mode::kNone) {
    reference_ = std::make_unique<ReferenceState>(ctx_.delta.max_reference_bytes);
  }
  thread_ = std::thread([this] { Run(); });
}

Persister::~Persister() {
  if (thread_.joinable()) Stop(/*abandon=*/false);
}

void Persister::Enqueue(std::shared_ptr<SaveJob> job) {
  MutexLock lock(&mu_);
  jobs_.push_back(std::move(job));
}

void Persister::Stop(bool abandon) {
  {
    MutexLock lock(&mu_);
    if (abandon) {
      abandon_ = true;
      for (auto& job : jobs_) job->Abort(absl::CancelledError("save cancelled: engine closing"));
    }
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void Persister::Run() {
  BecomeBackgroundThread("ckpt-persist", ctx_.background_nice);
  // (A multi-rank engine's ranks agree on the outcome even when they do not
  // rebuild: a rank that does not says so at once.)
  if (reference_ != nullptr && (ctx_.delta.resume_from_newest || ctx_.committer != nullptr)) {
    ResumeReference();
  }
  while (true) {
    std::shared_ptr<SaveJob> job;
    {
      MutexLock lock(&mu_);
      mu_.Await([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !jobs_.empty();
      });
      if (jobs_.empty()) return;
      job = jobs_.front();
    }
    SaveStats stats;
    absl::Status status = Persist(*job, &stats);
    {
      MutexLock lock(&mu_);
      jobs_.pop_front();
    }
    on_done_(*job, status, stats);
    job->Finish(std::move(status), std::move(stats));
  }
}

void Persister::ResumeReference() {
  const Clock::time_point start = Clock::now();
  // The engine owns the file system and outlives this thread.
  std::shared_ptr<FileSystem> fs(std::shared_ptr<FileSystem>(), ctx_.fs);
  const int rank = ctx_.committer != nullptr ? ctx_.committer->rank() : 0;
  const int world_size = ctx_.committer != nullptr ? ctx_.committer->world_size() : 1;
  absl::StatusOr<std::optional<RebuiltFrom>> from =
      absl::FailedPreconditionError("resume_from_newest is off");
  if (ctx_.delta.resume_from_newest) {
    // Ranks that share no ROOT each hold a copy of their own part alone.
    const bool own_part_only = ctx_.committer != nullptr && !ctx_.committer->options().shared_root;
    from = RebuildReference(fs, ctx_.root, ctx_.io, differential(), rank, world_size, reference_.get(),
                            [this] { return abandon_.load(); }, own_part_only);
  }
  if (!from.ok() && ctx_.delta.resume_from_newest) {
    Log(LogLevel::kWarning, absl::StrCat("the first save to ", ctx_.root,
                                         " is full: its delta reference could not be rebuilt: ",
                                         from.status().message()));
  } else if (from.ok() && from->has_value()) {
    Log(LogLevel::kInfo, absl::StrCat("delta reference of ", ctx_.root, " rebuilt from step ",
                                      (*from)->base_step, " (", reference_->bytes(), " bytes) in ",
                                      SecondsSince(start), " s"));
  }
  if (ctx_.committer == nullptr) return;
  // Every rank's first save is a delta or none is (distributed/resume_agreement.h).
  absl::StatusOr<std::string> claim = absl::FailedPreconditionError("nothing to take deltas against");
  if (!from.ok()) claim = from.status();
  if (from.ok() && from->has_value()) claim = RebuiltFromText(**from);
  absl::Status agreed = AgreeOnResume(ctx_.committer->options(), claim, [this] {
    if (abandon_) return true;
    MutexLock lock(&mu_);  // closing with no save to take the answer
    return stopping_ && jobs_.empty();
  });
  if (!agreed.ok() && reference_->valid()) {
    reference_->Invalidate();
    Log(LogLevel::kInfo, absl::StrCat("the first save to ", ctx_.root, " is full on every rank: ",
                                      agreed.message()));
  }
}

WorkerPool* Persister::CodecPool() {
  if (codec_pool_ == nullptr) {
    codec_pool_ = std::make_unique<WorkerPool>(WorkerPool::DefaultThreads(ctx_.compression.threads),
                                               "ckpt-encode", ctx_.background_nice);
  }
  return codec_pool_.get();
}

bool Persister::ShouldWriteDelta(const SaveJob& job) {
  if (reference_ == nullptr || !reference_->valid()) return false;
  if (reference_->deltas_since_full() + 1 >= std::max(1, ctx_.delta.full_every)) return false;
  // A full save early when a restore of the next delta would read more than
  // the bound (docs/deltas.md, "How much a restore reads").
  const double factor = ctx_.delta.max_restore_read_factor;
  const uint64_t predicted = reference_->PredictedRestoreBytes(differential());
  if (factor > 0 && predicted > factor * static_cast<double>(reference_->full_bytes())) {
    Log(LogLevel::kDebug, absl::StrCat("step ", job.step(), " is saved full: a restore of a delta would read ~",
                                       predicted, " bytes, over ", factor, " x the full save's ",
                                       reference_->full_bytes()));
    return false;
  }
  // The base must still be there (retention may have removed it).
  if (!ctx_.fs->Stat(JoinPath(ctx_.root, CheckpointDirName(reference_->base_step()))).ok()) {
    return false;
  }
  // A delta holds each record's staging chunks until the record is complete:
  // the pool must fit the largest record (plus the chunk it straddles into).
  uint64_t largest = 0;
  for (const TensorView& t : job.tensors) largest = std::max<uint64_t>(largest, t.nbytes);
  const uint64_t needed = (largest + ctx_.pool->chunk_bytes() - 1) / ctx_.pool->chunk_bytes() + 2;
  if (needed <= ctx_.pool->count()) return true;
  if (!warned_pool_too_small_) {
    warned_pool_too_small_ = true;
    Log(LogLevel::kWarning,
        absl::StrCat("saves to ", ctx_.root, " are written full, not as deltas: a delta needs ",
                     needed * ctx_.pool->chunk_bytes(), " bytes of staging memory (its largest tensor, ",
                     largest, " bytes, plus two chunks) but staging_bytes fixes it at ",
                     ctx_.pool->count() * ctx_.pool->chunk_bytes()));
  }
  return false;
}

void Persister::UpdateReference(const SaveJob& job, const StagedChunk& chunk, const char* data) {
  const PlannedShard& shard = job.plan[chunk.shard];
  const uint64_t begin = chunk.file_offset;
  const uint64_t end = begin + chunk.bytes;
  for (const PlannedRecord& rec : shard.records) {
    if (rec.offset >= end || rec.offset + rec.bytes <= begin) continue;
    const TensorView& t = job.tensors[rec.tensor];
    char* ref = reference_->FindOrCreate(t.name, t.dtype, t.shape, t.nbytes);
    if (ref == nullptr) continue;  // over the reference budget: always saved whole
    const uint64_t lo = std::max(begin, rec.offset);
    const uint64_t hi = std::min(end, rec.offset + rec.bytes);
    std::memcpy(ref + (lo - rec.offset), data + (lo - begin), hi - lo);
  }
}

// One save's writing: opens its shard files, takes its staged chunks as the
// stager hands them over, hashes each, and writes it as it is or hands it to
// the encoder, whose output buffers are written as they fill; it keeps the
// I/O queue busy meanwhile and gives every buffer back once its write is
// done. The first error sticks (`Fail`): the stager is stopped, what is in
// flight is drained, and every chunk goes back to the pool.
class Persister::ChunkWriter {
 public:
  ChunkWriter(Persister& persister, SaveJob& job, std::vector<std::unique_ptr<File>>& files, Plan& plan)
      : p_(persister),
        ctx_(persister.ctx_),
        job_(job),
        files_(files),
        plan_(plan),
        io_(ctx_.queue, ctx_.pool->chunk_bytes()),
        hasher_(job.plan, plan.hashes, plan.block_bytes, &plan.block_hashes) {}

  // Writes every chunk of the save; returns once all are written (and, with
  // an encoder, encoded) or the first error.
  absl::Status Run() {
    if (p_.abandon_) job_.Abort(absl::CancelledError("save cancelled: engine closing"));
    if (job_.abort) status_ = job_.abort_reason();
    job_.stage = SaveStage::kWriting;
    if (status_.ok()) status_ = OpenFiles();
    if (status_.ok()) status_ = PrepareRecords();
    if (!status_.ok()) job_.Abort(status_);
    encoder_ = plan_.encoder.get();
    update_reference_ = p_.reference_ != nullptr && !plan_.delta;
    while (more_ || io_.transfers_in_flight() > 0) Step();
    if (encoder_ != nullptr) {
      releasable_.clear();
      encoder_->TakeHeld(&releasable_);
      for (size_t r : releasable_) ctx_.pool->Release(r);
    }
    if (status_.ok()) status_ = job_.staging_status();
    if (status_.ok()) status_ = hasher_.Finish();
    if (status_.ok()) KillPoint("save.written");
    return status_;
  }

 private:
  // Creates the temp directory (every rank of a multi-rank save writes into
  // one: whoever comes first creates it) and the shard files.
  absl::Status OpenFiles() {
    absl::Status created = ctx_.fs->CreateDir(job_.temp_dir);
    if (ctx_.committer != nullptr && absl::IsAlreadyExists(created)) created = absl::OkStatus();
    CKPT_RETURN_IF_ERROR(created);
    OpenOptions open;
    open.write = true;
    open.create = true;
    open.exclusive = true;
    open.direct = ctx_.direct;
    for (size_t i = 0; i < job_.plan.size(); ++i) {
      CKPT_ASSIGN_OR_RETURN(std::unique_ptr<File> file,
                            ctx_.fs->Open(JoinPath(job_.temp_dir, job_.plan[i].file), open));
      files_.push_back(std::move(file));
    }
    return absl::OkStatus();
  }

  // Raw records: reserves each shard's final size. Encoded ones: creates the
  // encoder and its output buffers.
  absl::Status PrepareRecords() {
    EncoderChoice choice;
    choice.delta = plan_.delta;
    choice.codec = plan_.compress ? ctx_.compression.codec : CompressionCodec::kNone;
    choice.level = ctx_.compression.level;
    choice.delta_options = ctx_.delta;
    choice.reference = p_.reference_.get();
    choice.adaptive = &p_.adaptive_;
    choice.pool = [this] { return p_.CodecPool(); };
    if (!EncodesRecords(choice)) {
      // Raw shards have their final size now: reserving it gives each file
      // contiguous extents and the writes no size updates (about 10 % off a
      // durable save on the development VM), and a full disk fails here.
      for (size_t i = 0; i < files_.size(); ++i) {
        absl::Status s = files_[i]->Allocate(job_.plan[i].padded_bytes);
        if (!s.ok() && s.code() != absl::StatusCode::kUnimplemented) return s;
      }
      return absl::OkStatus();
    }
    ShardOutputs::EmitFn emit = [this](size_t shard, uint64_t offset, size_t buffer, size_t bytes) {
      job_.Touch();  // a write handed to the kernel is progress
      return io_.Start(IoOp::Kind::kWrite, files_[shard].get(), offset, outputs_->buffer(buffer), bytes,
                       kOutputTag | buffer);
    };
    ShardOutputs::WaitFn wait = [this]() -> absl::StatusOr<bool> {
      if (io_.transfers_in_flight() == 0) return false;
      Poll(/*block=*/true);
      if (!status_.ok()) return status_;
      return true;
    };
    CKPT_ASSIGN_OR_RETURN(std::unique_ptr<ShardOutputs> outputs,
                          ShardOutputs::Create(job_.plan.size(), ctx_.pool->chunk_bytes(),
                                               ctx_.output_buffers, emit, wait));
    CKPT_ASSIGN_OR_RETURN(plan_.encoder, NewShardEncoder(job_, choice, std::move(outputs)));
    outputs_ = &plan_.encoder->outputs();
    return absl::OkStatus();
  }

  // One turn of the loop: take what is staged, hash and write or encode it,
  // finish the encoder once staging is done, reap writes.
  void Step() {
    // Aborted from elsewhere: cancelled by `Close`, or given up by the watchdog.
    if (status_.ok() && p_.abandon_) Fail(absl::CancelledError("save cancelled: engine closing"));
    if (status_.ok() && job_.abort) Fail(job_.abort_reason());
    ready_.clear();
    if (more_) {
      const bool block = io_.transfers_in_flight() == 0;
      if (block) job_.stage = SaveStage::kStaging;
      more_ = job_.TakeChunks(block, /*stop_on_abort=*/status_.ok(), &ready_);
    }
    if (!ready_.empty()) {
      if (!plan_.writing_since.has_value()) plan_.writing_since = Clock::now();
      job_.stage = SaveStage::kWriting;
    }
    batch_.clear();
    batch_data_.clear();
    for (const StagedChunk& c : ready_) TakeChunk(c);
    if (!batch_.empty()) EncodeBatch();
    if (!more_ && status_.ok() && !staged_point_) {
      staged_point_ = true;
      KillPoint("save.staged");
    }
    if (!more_ && status_.ok() && encoder_ != nullptr && !finished_) {
      finished_ = true;
      job_.stage = SaveStage::kEncoding;
      absl::Status s = encoder_->Finish();
      if (!s.ok()) Fail(s);
    }
    if (io_.transfers_in_flight() > 0) Poll(/*block=*/ready_.empty());
    if (!status_.ok() && io_.transfers_in_flight() > 0) {
      written_.clear();
      (void)io_.Drain(&written_);
      Release(written_);
    }
  }

  // Hashes staged chunk `c`, then starts its write, or adds it to the batch
  // for the encoder; after a failure, gives it back.
  void TakeChunk(const StagedChunk& c) {
    if (status_.ok() && job_.abort) Fail(job_.abort_reason());
    const char* data = ctx_.pool->chunk(c.chunk);
    if (status_.ok()) {
      absl::Status hashed = hasher_.Consume(c, data);
      if (!hashed.ok()) Fail(hashed);
    }
    if (status_.ok() && update_reference_) p_.UpdateReference(job_, c, data);
    if (status_.ok() && encoder_ != nullptr) {
      batch_.push_back(c);  // encoded below, all at once
      batch_data_.push_back(data);
      return;
    }
    if (status_.ok()) {
      job_.Touch();  // a write handed to the kernel is progress
      absl::Status s = io_.Start(IoOp::Kind::kWrite, files_[c.shard].get(), c.file_offset,
                                 const_cast<char*>(data), c.bytes, c.chunk, ctx_.pool->buf_index(c.chunk));
      if (s.ok()) return;
      Fail(s);
    }
    ctx_.pool->Release(c.chunk);  // dropped by a failed save
  }

  // Encodes the batch (or, after a failure, drops it) and gives back the
  // staging chunks the encoder is done with.
  void EncodeBatch() {
    releasable_.clear();
    if (status_.ok()) {
      job_.stage = SaveStage::kEncoding;
      absl::Status s = encoder_->ConsumeBatch(batch_, batch_data_, &releasable_);
      if (!s.ok()) Fail(s);
    } else {
      for (const StagedChunk& c : batch_) releasable_.push_back(c.chunk);
    }
    for (size_t r : releasable_) ctx_.pool->Release(r);
  }

  // The first error sticks; the stager stops at its next chunk, or at once
  // if it waits for one.
  void Fail(absl::Status s) {
    job_.Abort(s);
    ctx_.pool->WakeWaiters();
    if (status_.ok()) status_ = std::move(s);
  }

  // Gives back the buffers of finished writes.
  void Release(const std::vector<uint64_t>& tags) {
    for (uint64_t tag : tags) {
      if (tag & kOutputTag) outputs_->Release(tag & ~kOutputTag);
      else ctx_.pool->Release(tag);
    }
    if (!tags.empty()) job_.Touch();
  }

  void Poll(bool block) {
    if (block) job_.stage = SaveStage::kWriting;
    written_.clear();
    absl::Status polled = io_.Poll(block, &written_);
    Release(written_);
    if (!polled.ok()) Fail(polled);
  }

  Persister& p_;
  const PersisterContext& ctx_;
  SaveJob& job_;
  std::vector<std::unique_ptr<File>>& files_;
  Plan& plan_;
  IoExecutor io_;
  RecordHasher hasher_;
  absl::Status status_;
  ShardEncoder* encoder_ = nullptr;  // set when the plan encodes
  ShardOutputs* outputs_ = nullptr;  // the encoder's
  bool update_reference_ = false;
  std::vector<uint64_t> written_;     // tags of finished writes
  std::vector<StagedChunk> ready_;    // taken from the stager this turn
  std::vector<StagedChunk> batch_;    // of `ready_`, for the encoder
  std::vector<const char*> batch_data_;
  std::vector<size_t> releasable_;
  bool more_ = true;                  // the stager may hand over more chunks
  bool finished_ = false;             // the encoder was finished
  bool staged_point_ = false;         // "save.staged" was passed
};

absl::Status Persister::WriteChunks(SaveJob& job, std::vector<std::unique_ptr<File>>& files,
                                    Plan& plan) {
  return ChunkWriter(*this, job, files, plan).Run();
}

absl::Status Persister::Commit(SaveJob& job, std::vector<std::unique_ptr<File>>& files,
                               const Plan& plan, SaveStats* stats) {
  job.stage = SaveStage::kCommitting;
  // Between steps that may take long (fsyncs), a save given up meanwhile stops.
  auto check_abort = [&job]() { return job.abort ? job.abort_reason() : absl::OkStatus(); };
  const ShardEncoder* encoder = plan.encoder.get();
  WrittenRecords written;
  written.hashes = plan.hashes;
  written.block_bytes = plan.block_bytes;
  written.block_hashes = plan.block_hashes;
  if (encoder != nullptr) {
    written.shards = encoder->shards();
    written.records = encoder->records();
    written.restored_hashes = encoder->restored_hashes();
  }
  std::optional<DeltaBase> base;
  if (plan.delta) {
    base = DeltaBase{reference_->base_step(), reference_->base_manifest_xxh3(), ctx_.delta.mode};
  }
  Manifest manifest = BuildSaveManifest(job.step(), job.tensors, job.plan, written,
                                        ctx_.committer != nullptr, base);
  for (size_t i = 0; i < job.plan.size(); ++i) {
    const ShardLayout layout =
        encoder != nullptr ? encoder->shards()[i]
                           : ShardLayout{job.plan[i].file_bytes, job.plan[i].padded_bytes};
    if (layout.file_bytes != layout.padded_bytes) {
      CKPT_RETURN_IF_ERROR(files[i]->Truncate(layout.file_bytes));
    }
    CKPT_RETURN_IF_ERROR(check_abort());
    CKPT_RETURN_IF_ERROR(files[i]->Sync());
    CKPT_RETURN_IF_ERROR(files[i]->Close());
    job.Touch();
  }
  KillPoint("save.synced");
  manifest.created_unix_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                 std::chrono::system_clock::now().time_since_epoch())
                                 .count();
  manifest.writer = ctx_.writer;
  manifest.extras_json = job.extras_json;
  CKPT_ASSIGN_OR_RETURN(std::string contents, SerializeManifest(&manifest));
  RankCommitter* const committer = ctx_.committer;
  // A rank's part of a multi-rank save has a manifest of its own; rank 0
  // writes the checkpoint's MANIFEST.json once every part is in.
  const std::string manifest_name =
      committer != nullptr ? RankManifestName(committer->rank()) : std::string(kManifestName);
  CKPT_RETURN_IF_ERROR(WriteFileDurably(*ctx_.fs, JoinPath(job.temp_dir, manifest_name), contents));
  if (committer == nullptr) KillPoint("commit.manifest");
  job.Touch();
  // Past this point the save completes (or fails) on its own: the watchdog
  // no longer gives up on it (a multi-rank save's wait for the other ranks
  // is bounded by `commit_timeout`).
  if (!job.BeginCommit()) return job.abort_reason();
  if (committer == nullptr) {
    CKPT_RETURN_IF_ERROR(CommitCheckpoint(*ctx_.fs, ctx_.root, job.temp_dir, job.final_name));
  } else {
    // The part's files are fsynced; their names in the shared directory too.
    CKPT_RETURN_IF_ERROR(SyncTempDir(*ctx_.fs, job.temp_dir));
    RankCommitter::Part part;
    part.manifest = manifest_name;
    part.manifest_xxh3 = manifest.manifest_xxh3;
    part.kind = manifest.kind;
    part.base_step = manifest.base_step;
    part.delta_mode = manifest.delta_mode;
    part.replicated_fingerprint = job.replicated_fingerprint;
    if (!committer->options().shared_root) part.contents = contents;
    // A preemption deadline ends the wait for the other ranks too: the save
    // commits only if every rank's part is durable within the grace.
    CKPT_RETURN_IF_ERROR(committer->CommitPart(
        job.step(), job.temp_dir, job.final_name, part, job.extras_json,
        [&job] { return ReasonToGiveUp(job); }));
  }
  KillPoint("commit.done");
  if (reference_ != nullptr) {
    reference_->Retain(job.tensors);
    reference_->Committed(job.step(), manifest.manifest_xxh3, manifest.kind == CheckpointKind::kDelta,
                          differential(), manifest.shard_bytes());
    if (differential() && plan.delta && manifest.kind != CheckpointKind::kDelta) {
      // Every tensor was stored whole, so this save is full, but a
      // differential reference still holds the last full save's values:
      // the next save is full, and the deltas after it are against that.
      reference_->Invalidate();
    } else if (differential() && committer != nullptr && committer->last_commit_mixed_kinds()) {
      // Some ranks saved full, others deltas: their next deltas would have
      // different bases. Every rank learnt it from rank 0's decision and
      // takes its next save full.
      reference_->Invalidate();
      Log(LogLevel::kInfo, absl::StrCat("step ", job.step(), " in ", ctx_.root,
                                        " has full parts and delta parts: the next save is full on every rank"));
    }
  }
  stats->tensor_bytes = manifest.tensor_bytes();
  stats->file_bytes = manifest.shard_bytes();
  stats->kind = manifest.kind;
  return absl::OkStatus();
}

absl::Status Persister::Persist(SaveJob& job, SaveStats* out) {
  const Clock::time_point persist_start = Clock::now();
  std::vector<std::unique_ptr<File>> files;
  Plan plan;
  plan.delta = ShouldWriteDelta(job);
  // Full saves are compressed unless the adaptive rule finds raw faster.
  plan.compress = ctx_.compression.codec != CompressionCodec::kNone &&
                  (plan.delta || ctx_.compression.codec != CompressionCodec::kPlanes ||
                   adaptive_.CompressSave());
  plan.hashes.assign(job.tensors.size(), 0);
  // A chunk of a global tensor larger than a block gets a hash per block,
  // so that a reader resharding it can check just the blocks it reads.
  if (ctx_.committer != nullptr) {
    plan.block_bytes.assign(job.tensors.size(), 0);
    plan.block_hashes.resize(job.tensors.size());
    for (size_t i = 0; i < job.tensors.size(); ++i) {
      const TensorView& t = job.tensors[i];
      if (t.placement == TensorPlacement::kSharded && t.nbytes > kBlockBytes) plan.block_bytes[i] = kBlockBytes;
    }
  }
  if (ctx_.committer != nullptr) ctx_.committer->AnnounceStep(job.step());
  absl::Status status = WriteChunks(job, files, plan);
  SaveStats stats;
  if (status.ok()) status = Commit(job, files, plan, &stats);
  if (!status.ok()) {
    // The first reason the save was given up for (e.g. cancelled, stalled)
    // is its outcome, not what that did to the stager or the writes.
    const absl::Status reason = job.abort_reason();
    if (!reason.ok()) status = reason;
    plan.encoder.reset();  // gives nothing back: its chunks were released or are dropped below
    files.clear();         // close what is open before removing the directory
    if (ctx_.committer != nullptr) {
      // The other ranks learn of it (and stop waiting for this one); the
      // error may be another rank's, which caused this one's.
      status = ctx_.committer->AbandonPart(job.temp_dir, status);
      ctx_.committer->RemoveOwnFiles(job.temp_dir);
    } else {
      RemoveTreeBestEffort(*ctx_.fs, job.temp_dir);
    }
    // The reference may be half updated: the next save is full.
    if (reference_ != nullptr) reference_->Invalidate();
    // (The watchdog's reason names the step and root already.)
    if (!job.expired()) {
      status = Annotate(status, absl::StrCat("save of step ", job.step(), " in ", ctx_.root));
    }
  }
  stats.step = job.step();
  stats.dir = status.ok() ? JoinPath(ctx_.root, job.final_name) : "";
  stats.tensor_count = job.tensors.size();
  stats.shard_count = job.plan.size();
  const StagingReport staged = job.staging_report();
  stats.blocked_s = staged.blocked_s;
  stats.blocked_cpu_s = staged.blocked_cpu_s;
  stats.staging_s = staged.staging_s;
  stats.staging_wait_s = staged.staging_wait_s;
  stats.staging_memory = staged.staging_memory;
  stats.persist_s = SecondsSince(plan.writing_since.value_or(persist_start));
  stats.seconds = SecondsSince(job.start_time);
  stats.persist_gbps = stats.persist_s > 0 ? stats.file_bytes / stats.persist_s / 1e9 : 0;
  if (status.ok() && !plan.delta && ctx_.compression.codec == CompressionCodec::kPlanes) {
    adaptive_.Saved(plan.compress, stats.tensor_bytes, stats.persist_s);
  }
  stats.backend = ctx_.backend;
  if (ctx_.committer != nullptr) {
    stats.rank = ctx_.committer->rank();
    stats.world_size = ctx_.committer->world_size();
    stats.ranks_wait_s = ctx_.committer->last_times().ranks_wait_s;
    stats.commit_latency_s = ctx_.committer->last_times().commit_latency_s;
  }
  *out = std::move(stats);
  return status;
}

}  // namespace ckpt::internal
