// One committed step's upload behind the save (ckpt/tier.h): alone, under
// the prefix's lease, or by the ranks of a multi-rank engine together over
// its coordination store -- rank 0 takes the lease and says "go", each rank
// publishes its own files (`PublishOptions::part`) and reports the list,
// rank 0 uploads the rest and writes the marker over every rank's files
// (`CommitPublishedParts`) and publishes the result, which every rank
// returns. No marker is written unless every rank's part is up and checked.
// A rank whose save of the step failed says so at once
// (`ReportFailedSave`), so that no rank waits for it.
#ifndef CKPT_OBJECT_STEP_UPLOAD_H_
#define CKPT_OBJECT_STEP_UPLOAD_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ckpt/distributed.h"
#include "ckpt/object_store.h"
#include "ckpt/object_tier.h"

namespace ckpt::internal {

// What every upload of one engine's tier shares.
struct TierTarget {
  std::string root;  // the engine's (a rank's own copy when `own_copy`)
  std::string url;   // for messages
  std::shared_ptr<ObjectStore> store;
  std::string prefix;  // in the bucket
  PublishOptions publish;
  std::string lease_owner;
  int attempts = 3;
  absl::Duration patience = absl::Hours(1);
  absl::Duration lease_wait = absl::Minutes(30);  // while another job holds the lease
  // Polled while waiting: true ends the wait (and the upload) with kCancelled.
  std::function<bool()> cancelled = [] { return false; };
};

// The ranks of a multi-rank engine (`world_size` > 1).
struct TierGroup {
  int rank = 0;
  int world_size = 1;
  std::shared_ptr<CoordinationStore> store;
  std::string key_prefix;  // the engine's `DistributedOptions::key_prefix`
  bool own_copy = false;   // `shared_root = false`: `root` is this rank's copy
};

struct StepUploadResult {
  uint64_t files = 0;
  uint64_t bytes = 0;  // this rank's
  bool already_there = false;
};

// `PublishCheckpoint` of `step` under the lease, tried up to
// `target.attempts` times while the error may be transient. `*attempts`:
// the tries it took, failed or not.
absl::StatusOr<StepUploadResult> UploadStepAlone(const TierTarget& target, int64_t step, int* attempts);

// This rank's side of the group upload of `step`'s `round`-th save (every
// rank counts the saves of a step alike, so a step saved again after a
// failure uses fresh keys). Returns once the marker is written (or why not).
// `*attempts`: the most tries one of this rank's requests took.
absl::StatusOr<StepUploadResult> UploadStepAsGroup(const TierTarget& target, const TierGroup& group,
                                                   int64_t step, int round, int* attempts);

// Tells the other ranks at once that this rank will not upload its part of
// `step`'s `round`-th save (`why`: its save failed, or it was cancelled):
// rank 0 in place of its "go", the others as their part.
absl::Status ReportFailedSave(const TierGroup& group, int64_t step, int round, const absl::Status& why);

}  // namespace ckpt::internal

#endif  // CKPT_OBJECT_STEP_UPLOAD_H_
