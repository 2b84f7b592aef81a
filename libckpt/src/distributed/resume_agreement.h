// `AgreeOnResume`: whether the ranks of a multi-rank engine, just opened on
// a root with checkpoints, may take their first save as a delta.
//
// Each rank rebuilds its delta reference from its own part of the newest
// checkpoint (engine/reference_rebuild.h). Rank 0 refuses a commit whose
// delta parts have different bases, and ranks whose references differ would
// drift apart (differential deltas: a rank that saved full takes its later
// deltas against another base than the others), so the first save must be a
// delta on every rank or full on every rank. The ranks settle it once, on
// their persister threads after the rebuild, through the store, as the
// commit protocol settles a save (rank_commit.h):
//
// Keys, under `DistributedOptions::key_prefix` P (unique per opening; the
// handshake checks it):
//   P/resume/claim/<r>   rank r's: {"ok": true, "claim": what it rebuilt
//                        from} or {"ok": false, "why": ...}
//   P/resume/decision    "delta:<claim>" (rank 0, once every rank claimed
//                        the same) or "full:<why>" (rank 0, or a rank that
//                        waited for a decision in vain); set once,
//                        atomically, so every rank that reads it reads the
//                        same answer.
//
// Every wait is bounded by `commit_timeout` (the others: a little longer, so
// that rank 0's verdict, naming a missing rank, is the one that stands).
#ifndef CKPT_DISTRIBUTED_RESUME_AGREEMENT_H_
#define CKPT_DISTRIBUTED_RESUME_AGREEMENT_H_

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckpt/distributed.h"

namespace ckpt::internal {

// This rank's side: publishes `claim` (what its reference was rebuilt from,
// the same text on every rank that read the same checkpoint; or, not OK,
// why it has no reference) and returns the decision: OK when every rank
// claimed the same, so this rank's first save may be a delta; otherwise why
// the first save is full (on every rank). A rank without a reference
// returns at once (its first save is full whatever the others claim; rank 0
// then decides full at once too). `cancelled()`, checked about once a
// second while waiting, ends the wait: the decision becomes full unless one
// was taken. A lost store also means full (the save will fail anyway).
absl::Status AgreeOnResume(const DistributedOptions& options,
                           const absl::StatusOr<std::string>& claim,
                           const std::function<bool()>& cancelled);

}  // namespace ckpt::internal

#endif  // CKPT_DISTRIBUTED_RESUME_AGREEMENT_H_
