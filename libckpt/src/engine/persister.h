// `Persister`: the background thread that writes staged chunks into shard
// files and commits each save, one save at a time, in the order saves were
// started. It also owns the reference state of delta checkpoints.
#ifndef CKPT_ENGINE_PERSISTER_H_
#define CKPT_ENGINE_PERSISTER_H_

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/file_system.h"
#include "ckpt/options.h"
#include "engine/adaptive_compression.h"
#include "engine/reference_state.h"
#include "distributed/rank_commit.h"
#include "engine/save_job.h"
#include "engine/shard_encoder.h"
#include "staging/staging_pool.h"
#include "util/mutex.h"
#include "util/worker_pool.h"

namespace ckpt::internal {

struct PersisterContext {
  FileSystem* fs = nullptr;
  IoQueue* queue = nullptr;  // used only by the persister thread
  StagingPool* pool = nullptr;
  std::string root;
  bool direct = false;
  std::string backend;
  std::string writer;         // "ckpt <version>"
  IoOptions io;               // for reading the reference state back at start
  // Full records: raw, zstd or planes (level >= 1; see EffectiveCompression).
  CompressionOptions compression;
  DeltaOptions delta;
  // Encoded (delta, zstd or planes) saves write through this many output buffers of
  // a staging chunk's size; any number >= 1 works (see ShardOutputs).
  size_t output_buffers = 8;
  int background_nice = 0;  // see EngineOptions
  // A multi-rank engine's side of the commit; null for a single process.
  RankCommitter* committer = nullptr;
};

class Persister {
 public:
  // `on_done` runs on the persister thread after each save finished (any
  // outcome), just before its handle is completed: whoever returns from
  // `Wait` sees the engine's bookkeeping already updated.
  using DoneFn = std::function<void(SaveJob&, const absl::Status&, const SaveStats&)>;
  Persister(PersisterContext context, DoneFn on_done);
  ~Persister();  // REQUIRES: `Stop` was called

  // Queues `job`; the persister starts on it once earlier jobs are done.
  void Enqueue(std::shared_ptr<SaveJob> job);
  // Finishes every queued job (or, with `abandon`, fails them fast: their
  // stagers see `SaveJob::abort` and the partial checkpoints are removed),
  // then joins the thread.
  void Stop(bool abandon);

 private:
  // What the persister decided and learnt for one save: its own, kept on
  // its thread, never in the shared `SaveJob`.
  struct Plan {
    bool delta = false;  // encoded against the reference state
    bool compress = false;  // full records through the codec (else raw)
    std::unique_ptr<ShardEncoder> encoder;  // null: raw chunks written as staged
    std::vector<uint64_t> hashes;  // XXH3-64 per tensor (engine/record_hasher.h)
    // A sharded chunk's block size (0: none) and block hashes, per tensor.
    std::vector<uint64_t> block_bytes;
    std::vector<std::vector<uint64_t>> block_hashes;
    std::optional<Clock::time_point> writing_since;  // when the first staged chunk was taken
  };

  // One save's writing (persister.cc).
  class ChunkWriter;

  void Run();
  // Writes and commits `job`; returns its outcome and figures.
  absl::Status Persist(SaveJob& job, SaveStats* stats);
  bool ShouldWriteDelta(const SaveJob& job);
  // Rebuilds the reference state from the root's newest checkpoint
  // (`DeltaOptions::resume_from_newest`); logs what it did.
  void ResumeReference();
  // The threads that encode (created on first use; the persister is one).
  WorkerPool* CodecPool();
  bool differential() const { return ctx_.delta.base == DeltaOptions::Base::kDifferential; }
  // Writes the job's chunks as they are staged (encoding them when the plan
  // says so); returns once all are written or the first error.
  absl::Status WriteChunks(SaveJob& job, std::vector<std::unique_ptr<File>>& files, Plan& plan);
  // Truncates, fsyncs and closes the shards, writes the manifest, commits.
  absl::Status Commit(SaveJob& job, std::vector<std::unique_ptr<File>>& files, const Plan& plan,
                      SaveStats* stats);
  // Copies the record bytes of a raw chunk into the reference state.
  void UpdateReference(const SaveJob& job, const StagedChunk& chunk, const char* data);

  const PersisterContext ctx_;
  const DoneFn on_done_;
  std::atomic<bool> abandon_{false};
  std::unique_ptr<ReferenceState> reference_;  // persister thread only; null without deltas
  bool warned_pool_too_small_ = false;          // persister thread only
  std::unique_ptr<WorkerPool> codec_pool_;      // persister thread only
  AdaptiveCompression adaptive_;                // persister thread only
  Mutex mu_;
  std::deque<std::shared_ptr<SaveJob>> jobs_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace ckpt::internal

#endif  // CKPT_ENGINE_PERSISTER_H_
