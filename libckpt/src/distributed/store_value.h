// The values ranks leave in the coordination store to agree on a save's
// commit (rank_commit.h) and on resuming deltas (resume_agreement.h), as one
// small typed encoding: a JSON object
//   {"verdict": "abort", "code": 4, "message": "rank 1 ..."}
//   {"verdict": "delta", "text": "step 7 #ab12"}
// encoded and decoded here alone, never taken apart by prefixes.
#ifndef CKPT_DISTRIBUTED_STORE_VALUE_H_
#define CKPT_DISTRIBUTED_STORE_VALUE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckpt::internal {

enum class Verdict : uint8_t {
  kCommit,            // rank 0 commits the save (every part of one kind)
  kCommitMixedKinds,  // rank 0 commits a save whose parts are full on some ranks, deltas on others
  kAbort,             // the save is given up; `status` says why
  kCommitted,         // rank 0's commit succeeded
  kCommitFailed,      // rank 0's commit failed; `status` says why
  kDelta,             // resume: the first saves are deltas against `text` (a claim)
  kFull,              // resume: the first save is full; `text` says why
};

struct StoreValue {
  Verdict verdict = Verdict::kAbort;
  absl::Status status;  // kAbort, kCommitFailed: not OK
  std::string text;     // kDelta, kFull

  static StoreValue Commit(bool mixed_kinds) {
    return {mixed_kinds ? Verdict::kCommitMixedKinds : Verdict::kCommit, absl::OkStatus(), ""};
  }
  static StoreValue Abort(absl::Status why) { return {Verdict::kAbort, std::move(why), ""}; }
  static StoreValue Committed() { return {Verdict::kCommitted, absl::OkStatus(), ""}; }
  static StoreValue CommitFailed(absl::Status why) { return {Verdict::kCommitFailed, std::move(why), ""}; }
  static StoreValue Delta(std::string claim) { return {Verdict::kDelta, absl::OkStatus(), std::move(claim)}; }
  static StoreValue Full(std::string why) { return {Verdict::kFull, absl::OkStatus(), std::move(why)}; }

  bool is_commit() const { return verdict == Verdict::kCommit || verdict == Verdict::kCommitMixedKinds; }
};

std::string EncodeStoreValue(const StoreValue& value);

// The value `text` encodes; kInternal "unreadable <what> in the coordination
// store: <text>" for anything else (a status of kAbort or kCommitFailed that
// is OK or of an unknown code included).
absl::StatusOr<StoreValue> DecodeStoreValue(absl::string_view text, absl::string_view what);

}  // namespace ckpt::internal

#endif  // CKPT_DISTRIBUTED_STORE_VALUE_H_
