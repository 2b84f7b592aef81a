// ckpt/tier.h: upload behind the save. An engine opened with
// `EngineOptions::tier.url = "s3://bucket/prefix"` publishes every checkpoint
// it commits to that bucket prefix in the background (ckpt/object_tier.h:
// every file uploaded and checked, the commit marker last, under the prefix's
// lease), in commit order, and says per step whether it is durable there:
//
//   ckpt::EngineOptions options;
//   options.tier.url = "s3://my-bucket/run1";
//   options.tier.max_stream_bytes_per_second = 32 << 20;  // spare the job
//   auto engine = ckpt::Engine::Open("/nvme/ckpt/run1", options);
//   (*engine)->Save(step, tensors);                        // durable locally
//   ckpt::TierStepStatus s = (*engine)->tier()->WaitFor(step, absl::Minutes(10));
//   if (s.state != ckpt::TierState::kDurable) ... s.error ...
//
// An upload failure never fails a save: the local checkpoint is durable
// either way, and the upload's outcome is in `TierUploader::Status`.
//
// With a multi-rank engine (ckpt/distributed.h) every rank uploads its own
// part and rank 0 writes one marker once every part is up and checked, over
// the engine's `DistributedOptions::store`; ranks that share no file system
// (`shared_root = false`) upload from their own copies, and once a step is
// durable in the bucket each rank removes its copies of older steps that the
// step's delta chain does not need. What `Checkpointer(root, tier=...)` does
// from Python (docs/object-storage.md, "Upload behind the save").
#ifndef CKPT_TIER_H_
#define CKPT_TIER_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace ckpt {

struct TierOptions {
  // "s3://bucket/prefix": where committed checkpoints go. Empty: no tier.
  // Credentials, region and endpoint are the AWS tools' (docs/object-storage.md).
  std::string url;
  // Requests in flight at once, and the size of a multipart upload's parts
  // (at least 5 MiB, S3's smallest part). Memory: streams * part_bytes.
  int streams = 8;
  uint64_t part_bytes = uint64_t{8} << 20;
  // Bytes per second each stream may send (0: unlimited): the upload sends
  // at most streams * this, sparing the training job's network.
  int64_t max_stream_bytes_per_second = 0;
  // `PublishOptions::storage_class` (empty: the bucket's default).
  std::string storage_class;
  // Tries per step (an upload that fails for a transient reason -- the
  // network, the store -- is tried again after 0.5 s, 1 s, ...).
  int attempts = 3;
  // How long an upload waits while another job holds the bucket prefix's
  // lease (a `ckpt-retain` run tiering into the same prefix) before it fails
  // naming the holder; the wait counts as no try. Zero: fail at once.
  absl::Duration lease_wait = absl::Minutes(30);
  // How long the ranks of a multi-rank upload wait for one another (a rank's
  // whole part, rank 0's marker); also the duration of the lease rank 0
  // takes (renewed while held).
  absl::Duration group_patience = absl::Hours(1);
};

enum class TierState {
  kUnknown,      // never submitted (no save of the step finished here)
  kPending,      // committed locally, waiting for the uploads before it
  kUploading,
  kDurable,      // its marker is in the bucket: the step is there, verified
  kFailed,       // the upload failed (`error`); the local copy stands
  kNotUploaded,  // the save failed or was skipped: nothing to upload
  kCancelled,    // the engine closed with `CloseMode::kCancel` first
};
absl::string_view TierStateName(TierState state);

struct TierStepStatus {
  TierState state = TierState::kUnknown;
  absl::Status error;          // kFailed, kNotUploaded: why
  bool already_there = false;  // kDurable: an earlier run had published it
  uint64_t files = 0;          // kDurable: the checkpoint's objects
  uint64_t bytes = 0;          // kDurable: the bytes this rank uploaded (its part's)
  int attempts = 0;            // tries it took (kDurable, kFailed)
  double seconds = 0;          // from the upload's start to its end
  bool finished() const {
    return state == TierState::kDurable || state == TierState::kFailed ||
           state == TierState::kNotUploaded || state == TierState::kCancelled;
  }
};

// The uploads of an engine's tier (`Engine::tier()`). Thread-safe.
class TierUploader {
 public:
  virtual ~TierUploader() = default;
  virtual const std::string& url() const = 0;
  // The latest save of `step` as far as the tier knows.
  virtual TierStepStatus Status(int64_t step) const = 0;
  // Every step the tier saw, ascending.
  virtual std::map<int64_t, TierStepStatus> StatusAll() const = 0;
  // Blocks until `step`'s latest save is finished with (`finished()`), or
  // `timeout` passed; returns its status then. A step never submitted
  // returns kUnknown at once.
  virtual TierStepStatus WaitFor(int64_t step, absl::Duration timeout) const = 0;
  // Blocks until every step submitted so far is finished with; false when
  // `timeout` passed first.
  virtual bool WaitIdle(absl::Duration timeout) const = 0;
};

}  // namespace ckpt

#endif  // CKPT_TIER_H_
