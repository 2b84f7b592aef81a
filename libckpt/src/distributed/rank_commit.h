// `RankCommitter`: one rank's side of the multi-rank commit protocol, run on
// the persister thread (see docs/distributed.md for the protocol and its
// failure behaviour).
//
// Keys, under `DistributedOptions::key_prefix` P:
//   P/nonce                  rank 0's, with the world size and its writer
//                            lock's owner line, published once ROOT is
//                            clean (Open)
//   P/current/<r>            the step rank r is persisting now (for messages)
//   P/<temp>/report/<r>      rank r's part: durable (manifest name, checksum,
//                            kind, base; the manifest itself when the ranks
//                            share no ROOT) or failed (why)
//   P/<temp>/manifest        the checkpoint's MANIFEST.json (rank 0, before
//                            it decides to commit; only when the ranks share
//                            no ROOT, so that each commits a copy with it)
//   P/<temp>/decision        "commit" (rank 0, once every part checked out;
//                            "commit:mixed-kinds" when some parts are full
//                            and others deltas) or "abort:<code>:<why>"
//                            (any rank); set once,
//                            atomically, so no rank gives up on a save
//                            another rank goes on to commit
//   P/<temp>/result          rank 0, after "commit": "ok" or "error:<code>:<why>"
//   P/<temp>/seen/<r>        rank r >= 1, once it read the result; rank 0's
//                            save completes after every rank's (bounded), so
//                            a store hosted in rank 0's process outlives
//                            every read of the result
// where <temp> is the save's temp directory name, which holds the step, the
// nonce and an attempt count, so every save of every opening has its own keys.
#ifndef CKPT_DISTRIBUTED_RANK_COMMIT_H_
#define CKPT_DISTRIBUTED_RANK_COMMIT_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "ckpt/distributed.h"
#include "ckpt/file_system.h"
#include "ckpt/kinds.h"
#include "ckpt/options.h"

namespace ckpt::internal {

class RankCommitter {
 public:
  // `writer` goes into the global manifest (rank 0).
  RankCommitter(DistributedOptions options, FileSystem* fs, std::string root, std::string writer);

  int rank() const { return options_.rank; }
  int world_size() const { return options_.world_size; }
  const DistributedOptions& options() const { return options_; }
  // Set by `Handshake`; part of every temp directory name.
  const std::string& nonce() const { return nonce_; }

  // At Open (caller's thread). Rank 0, once ROOT is clean, publishes a fresh
  // nonce, the world size, `shared_root` and the owner line of the writer
  // lock it holds; the others wait for them (up to `commit_timeout`), check
  // the world size and `shared_root`, and with a shared ROOT find that line
  // in ROOT's lock file (kFailedPrecondition if not: ROOT is not one
  // directory all ranks share, which every save would need).
  absl::Status Handshake();

  // Tells the other ranks which step this rank persists now.
  void AnnounceStep(int64_t step);

  // This rank's part of a save, durable in the temp directory.
  struct Part {
    std::string manifest;  // RankManifestName(rank)
    uint64_t manifest_xxh3 = 0;
    CheckpointKind kind = CheckpointKind::kFull;
    int64_t base_step = -1;
    DeltaOptions::Mode delta_mode = DeltaOptions::Mode::kNone;
    uint64_t replicated_fingerprint = 0;
    // The manifest's contents: sent with the report when the ranks share no
    // ROOT (rank 0 cannot read it from the temp directory then).
    std::string contents;
  };
  // A part as rank 0 learns of it from its rank's report.
  struct Reported {
    uint64_t manifest_xxh3 = 0;
    std::string contents;  // only when the ranks share no ROOT
  };
  // Why this rank gave the save up (Close(kCancel), a preemption deadline),
  // or OK while it goes on.
  using CancelledFn = std::function<absl::Status()>;

  // Reports `part` of step `step`, then: rank 0 waits for every rank's
  // report, checks the parts against each other (steps, replicated
  // declarations, tensors two ranks both saved), writes the checkpoint's
  // MANIFEST.json into `temp_dir` and commits it as `final_name`; the others
  // wait for rank 0's decision and its result (ranks that share no ROOT:
  // each writes rank 0's MANIFEST.json into its own `temp_dir` and commits
  // that too). OK once the checkpoint is committed; otherwise why not,
  // naming the rank at fault.
  absl::Status CommitPart(int64_t step, const std::string& temp_dir,
                          const std::string& final_name, const Part& part,
                          const std::string& extras_json, const CancelledFn& cancelled);

  // How long the last `CommitPart` waited, in seconds (see
  // SaveStats::ranks_wait_s and commit_latency_s).
  struct Times {
    double ranks_wait_s = 0;
    double commit_latency_s = 0;
  };
  const Times& last_times() const { return times_; }
  // Whether the save the last `CommitPart` committed had full parts and delta
  // parts (one rank's read bound, or a rank whose every tensor was stored
  // whole). Every rank learns it from rank 0's decision, so with
  // differential deltas every rank can take its next save full alike, before
  // their bases part ways.
  bool last_commit_mixed_kinds() const { return last_commit_mixed_kinds_; }

  // This rank's part of the save into `temp_dir` failed with `error` (or the
  // save was given up): reports it, unless `CommitPart` already did, so no
  // rank waits for this one; rank 0 also decides to abort. Returns the error
  // the save fails with: another rank's reason, if the save had been aborted
  // for it already (this rank's own failure then likely follows from it),
  // else `error`.
  absl::Status AbandonPart(const std::string& temp_dir, const absl::Status& error);

  // Removes what this rank wrote into `temp_dir` (rank 0, and every rank
  // when the ranks share no ROOT: the directory).
  void RemoveOwnFiles(const std::string& temp_dir);

 private:
  std::string SaveKey(const std::string& temp_dir, absl::string_view what) const;
  // Waits for `key` until `deadline`, in slices; after each slice that ends
  // without it, `interrupt` (if set) may end the wait with its non-OK status
  // (a cancelled save, a decision another rank took).
  using InterruptFn = std::function<absl::Status()>;
  absl::StatusOr<std::string> WaitFor(const std::string& key, absl::Time deadline,
                                      const InterruptFn& interrupt);
  // Sets the save's decision to abort for `reason` unless one was taken;
  // returns the status the save ends with (the decision that stands).
  absl::Status DecideAbort(const std::string& temp_dir, const absl::Status& reason);
  // OK once ROOT's writer lock file here holds `lock_line`, the line rank 0
  // read from it at its open (retried a few seconds); else
  // kFailedPrecondition: this rank's ROOT is not rank 0's.
  absl::Status SeesRankZerosRoot(const std::string& lock_line);
  // Rank 0's side of a save: collects the reports (`CollectReports`), loads
  // and checks the parts (rank_commit.cc's `LoadParts`, `CheckAgreement`),
  // then writes the checkpoint's manifest, decides and commits. Any reason
  // not to commit becomes the save's abort decision.
  absl::Status CommitAsRankZero(int64_t step, const std::string& temp_dir,
                                const std::string& final_name, const Part& part,
                                const std::string& extras_json, const CancelledFn& cancelled);
  // Every other rank's report of its part of `step`, by rank (rank 0's from
  // `part`). Ends early, with the reason to abort, when a rank failed or is
  // missing past `commit_timeout`, another rank decided, or `cancelled` says
  // so.
  absl::StatusOr<std::vector<Reported>> CollectReports(int64_t step, const std::string& temp_dir,
                                                       const Part& part, const CancelledFn& cancelled);
  // After rank 0 set the result: waits (at most `kResultSeenPatience`, or
  // `commit_timeout` if shorter) until every other rank has read it.
  void AwaitResultSeen(const std::string& temp_dir);
  absl::Status FollowRankZero(int64_t step, const std::string& temp_dir, const std::string& final_name,
                              const CancelledFn& cancelled);
  // Ranks that share no ROOT, once rank 0 decided to commit: writes the
  // checkpoint's MANIFEST.json (from the store) into this rank's own
  // `temp_dir`, checks it lists this rank's part as reported, and commits
  // the directory as `final_name`.
  absl::Status CommitOwnCopy(int64_t step, const std::string& temp_dir, const std::string& final_name);

  const DistributedOptions options_;
  FileSystem* const fs_;
  const std::string root_;
  const std::string writer_;
  std::string nonce_;
  // The temp directory whose save this rank reported last (persister thread).
  std::string reported_;
  Times times_;
  bool last_commit_mixed_kinds_ = false;
};

}  // namespace ckpt::internal

#endif  // CKPT_DISTRIBUTED_RANK_COMMIT_H_
