// `BackgroundTier`: the `TierUploader` of an engine opened with
// `EngineOptions::tier` (ckpt/tier.h). The engine's persister hands it each
// save's outcome (`Submit` a committed step, `Skip` one that failed or was
// skipped); one thread uploads the committed ones in that order, so a delta
// goes up after its base (object/step_upload.h).
#ifndef CKPT_OBJECT_BACKGROUND_TIER_H_
#define CKPT_OBJECT_BACKGROUND_TIER_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckpt/distributed.h"
#include "ckpt/file_system.h"
#include "ckpt/tier.h"
#include "object/step_upload.h"
#include "util/mutex.h"

namespace ckpt::internal {

// kInvalidArgument naming the first field of `options` out of its range (a
// URL that is not s3://bucket/prefix included). Touches nothing.
absl::Status ValidateTierOptions(const TierOptions& options);

class BackgroundTier final : public TierUploader {
 public:
  // Opens the store of `options.url` (credentials and endpoint resolved now,
  // so that a misconfiguration fails `Engine::Open`) and starts the thread.
  // `root`: the engine's; `dist`: its distributed options (world_size 1:
  // uploads alone).
  static absl::StatusOr<std::unique_ptr<BackgroundTier>> Start(const std::string& root,
                                                               const TierOptions& options,
                                                               std::shared_ptr<FileSystem> fs,
                                                               const DistributedOptions& dist);
  ~BackgroundTier() override;  // Close(false)

  // Step `step` committed: queue its upload.
  void Submit(int64_t step) ABSL_LOCKS_EXCLUDED(mu_);
  // Step `step`'s save failed or was skipped: nothing to upload; with a
  // group, tells the other ranks at once.
  void Skip(int64_t step, const absl::Status& why) ABSL_LOCKS_EXCLUDED(mu_);
  // Uploads everything queued (or, with `cancel`, drops what has not
  // started and ends the one in progress at its next wait), then stops.
  // Idempotent; `Status` and the waits keep working afterwards.
  void Close(bool cancel) ABSL_LOCKS_EXCLUDED(mu_);

  const std::string& url() const override { return target_.url; }
  TierStepStatus Status(int64_t step) const override ABSL_LOCKS_EXCLUDED(mu_);
  std::map<int64_t, TierStepStatus> StatusAll() const override ABSL_LOCKS_EXCLUDED(mu_);
  TierStepStatus WaitFor(int64_t step, absl::Duration timeout) const override ABSL_LOCKS_EXCLUDED(mu_);
  bool WaitIdle(absl::Duration timeout) const override ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Queued {
    int64_t step;
    int round;
  };
  BackgroundTier(TierTarget target, std::optional<TierGroup> group, std::shared_ptr<FileSystem> fs);
  void Run() ABSL_LOCKS_EXCLUDED(mu_);
  // Records `step`'s status; returns which save of the step this is.
  int Begin(int64_t step, TierStepStatus status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ranks that share no ROOT: this rank's copies older than `durable` that
  // its delta chain does not need.
  void PruneOwnCopies(int64_t durable);

  TierTarget target_;
  const std::optional<TierGroup> group_;
  const std::shared_ptr<FileSystem> fs_;

  mutable Mutex mu_;
  std::deque<Queued> queue_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;  // an upload in progress
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::map<int64_t, TierStepStatus> status_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, int> rounds_ ABSL_GUARDED_BY(mu_);  // saves of each step seen
  std::thread thread_;
};

}  // namespace ckpt::internal

#endif  // CKPT_OBJECT_BACKGROUND_TIER_H_
