// BackgroundTier: an engine's uploads behind the save (object/background_tier.h).
#include "object/background_tier.h"

#include <unistd.h>

#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "ckpt/catalog.h"
#include "ckpt/maintenance.h"
#include "ckpt/object_store.h"
#include "read/rank_copy.h"
#include "util/log.h"
#include "util/status_macros.h"

namespace ckpt {

absl::string_view TierStateName(TierState state) {
  switch (state) {
    case TierState::kUnknown:
      return "unknown";
    case TierState::kPending:
      return "pending";
    case TierState::kUploading:
      return "uploading";
    case TierState::kDurable:
      return "durable";
    case TierState::kFailed:
      return "failed";
    case TierState::kNotUploaded:
      return "not uploaded";
    case TierState::kCancelled:
      return "cancelled";
  }
  return "?";
}

namespace internal {
namespace {

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "?";
  return name;
}

}  // namespace

absl::Status ValidateTierOptions(const TierOptions& options) {
  auto url = ParseObjectUrl(options.url);
  if (!url.ok()) return absl::InvalidArgumentError(absl::StrCat("tier.url: ", url.status().message()));
  if (options.streams < 1 || options.streams > 1024) {
    return absl::InvalidArgumentError(absl::StrCat("tier.streams ", options.streams, " is not in 1..1024"));
  }
  if (options.part_bytes < (uint64_t{5} << 20) || options.part_bytes > (uint64_t{5} << 30)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tier.part_bytes ", options.part_bytes, " is not in 5 MiB..5 GiB (S3's part sizes)"));
  }
  if (options.max_stream_bytes_per_second < 0) {
    return absl::InvalidArgumentError("tier.max_stream_bytes_per_second is negative (0: unlimited)");
  }
  if (options.attempts < 1) return absl::InvalidArgumentError("tier.attempts must be at least 1");
  if (options.lease_wait < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("tier.lease_wait must not be negative");
  }
  if (options.group_patience <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("tier.group_patience must be positive");
  }
  absl::Status storage_class = CheckStorageClass(options.storage_class);
  if (!storage_class.ok()) return Annotate(storage_class, "tier.storage_class");
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<BackgroundTier>> BackgroundTier::Start(const std::string& root,
                                                                      const TierOptions& options,
                                                                      std::shared_ptr<FileSystem> fs,
                                                                      const DistributedOptions& dist) {
  CKPT_RETURN_IF_ERROR(ValidateTierOptions(options));
  CKPT_ASSIGN_OR_RETURN(ObjectUrl url, ParseObjectUrl(options.url));
  ObjectStoreOptions store_options;
  store_options.max_send_bytes_per_second = options.max_stream_bytes_per_second;
  auto store = OpenObjectStore(options.url, store_options);
  if (!store.ok()) return Annotate(store.status(), absl::StrCat("tier ", options.url));
  TierTarget target;
  target.root = root;
  target.url = options.url;
  target.store = std::move(*store);
  target.prefix = url.prefix;
  target.publish.streams = options.streams;
  target.publish.part_bytes = options.part_bytes;
  target.publish.storage_class = options.storage_class;
  target.publish.fs = fs;
  target.lease_owner = absl::StrCat("ckpt engine ", HostName(), " pid ", getpid(), " for ", root);
  target.attempts = options.attempts;
  target.patience = options.group_patience;
  target.lease_wait = options.lease_wait;
  std::optional<TierGroup> group;
  if (dist.world_size > 1) {
    group = TierGroup{dist.rank, dist.world_size, dist.store, dist.key_prefix, !dist.shared_root};
  }
  std::unique_ptr<BackgroundTier> tier(new BackgroundTier(std::move(target), std::move(group), std::move(fs)));
  tier->thread_ = std::thread([t = tier.get()] { t->Run(); });
  return tier;
}

BackgroundTier::BackgroundTier(TierTarget target, std::optional<TierGroup> group, std::shared_ptr<FileSystem> fs)
    : target_(std::move(target)), group_(std::move(group)), fs_(std::move(fs)) {
  target_.cancelled = [this] {
    MutexLock lock(&mu_);
    return cancelled_;
  };
}

BackgroundTier::~BackgroundTier() { Close(false); }

int BackgroundTier::Begin(int64_t step, TierStepStatus status) {
  status_[step] = std::move(status);
  return rounds_[step]++;
}

void BackgroundTier::Submit(int64_t step) {
  MutexLock lock(&mu_);
  TierStepStatus pending;
  pending.state = closing_ && cancelled_ ? TierState::kCancelled : TierState::kPending;
  const int round = Begin(step, pending);
  if (pending.state == TierState::kPending) queue_.push_back({step, round});
}

void BackgroundTier::Skip(int64_t step, const absl::Status& why) {
  int round;
  {
    MutexLock lock(&mu_);
    TierStepStatus skipped;
    skipped.state = TierState::kNotUploaded;
    skipped.error = why;
    round = Begin(step, std::move(skipped));
  }
  if (group_.has_value()) {
    // So that no rank waits for this one's part; if the store cannot be
    // reached, the others give up after their patience.
    absl::Status told = ReportFailedSave(*group_, step, round, Annotate(why, "its save of the step failed"));
    if (!told.ok()) {
      Log(LogLevel::kWarning, absl::StrCat("tier: could not tell the other ranks that step ", step,
                                           "'s save failed here: ", told.message()));
    }
  }
}

void BackgroundTier::Close(bool cancel) {
  std::deque<Queued> dropped;
  {
    MutexLock lock(&mu_);
    if (cancel) {
      cancelled_ = true;
      for (const Queued& q : queue_) status_[q.step].state = TierState::kCancelled;
      dropped.swap(queue_);
    }
    closing_ = true;
  }
  if (group_.has_value()) {
    for (const Queued& q : dropped) {  // so that no rank waits for this one's part
      ReportFailedSave(*group_, q.step, q.round,
                       absl::CancelledError("its engine was closed with kCancel before the upload began"))
          .IgnoreError();
    }
  }
  if (thread_.joinable()) thread_.join();
}

TierStepStatus BackgroundTier::Status(int64_t step) const {
  MutexLock lock(&mu_);
  auto it = status_.find(step);
  return it == status_.end() ? TierStepStatus{} : it->second;
}

std::map<int64_t, TierStepStatus> BackgroundTier::StatusAll() const {
  MutexLock lock(&mu_);
  return status_;
}

TierStepStatus BackgroundTier::WaitFor(int64_t step, absl::Duration timeout) const {
  MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(
      [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        auto it = status_.find(step);
        return it == status_.end() || it->second.finished();
      },
      timeout);
  auto it = status_.find(step);
  return it == status_.end() ? TierStepStatus{} : it->second;
}

bool BackgroundTier::WaitIdle(absl::Duration timeout) const {
  MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return queue_.empty() && !busy_; },
                              timeout);
}

void BackgroundTier::Run() {
  while (true) {
    Queued next;
    {
      MutexLock lock(&mu_);
      mu_.Await([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return !queue_.empty() || closing_; });
      if (queue_.empty()) return;  // closing, and nothing left
      next = queue_.front();
      queue_.pop_front();
      busy_ = true;
      status_[next.step].state = TierState::kUploading;
    }
    const absl::Time start = absl::Now();
    TierStepStatus done;
    absl::StatusOr<StepUploadResult> uploaded =
        group_.has_value() ? UploadStepAsGroup(target_, *group_, next.step, next.round, &done.attempts)
                           : UploadStepAlone(target_, next.step, &done.attempts);
    done.seconds = absl::ToDoubleSeconds(absl::Now() - start);
    if (uploaded.ok()) {
      done.state = TierState::kDurable;
      done.files = uploaded->files;
      done.bytes = uploaded->bytes;
      done.already_there = uploaded->already_there;
    } else {
      done.state = absl::IsCancelled(uploaded.status()) ? TierState::kCancelled : TierState::kFailed;
      done.error = Annotate(uploaded.status(),
                            absl::StrCat("upload of step ", next.step, " to ", target_.url));
      Log(LogLevel::kWarning, done.error.message());
    }
    if (uploaded.ok() && group_.has_value() && group_->own_copy) PruneOwnCopies(next.step);
    MutexLock lock(&mu_);
    busy_ = false;
    // (A later save of the step, after a failure, may have replaced the status.)
    if (rounds_[next.step] == next.round + 1) status_[next.step] = std::move(done);
  }
}

void BackgroundTier::PruneOwnCopies(int64_t durable) {
  std::set<int64_t> keep = {durable};
  for (int64_t step = durable;;) {
    auto summary = SummarizeRankCopy(target_.root, step, fs_, group_->rank);
    if (!summary.ok() || !summary->manifest_status.ok()) return;  // a base unknown: remove nothing
    if (summary->kind != CheckpointKind::kDelta) break;
    step = summary->base_step;
    if (!keep.insert(step).second) break;
  }
  auto steps = ListSteps(target_.root, fs_);
  if (!steps.ok()) return;
  for (int64_t step : *steps) {
    if (step >= durable || keep.count(step) != 0) continue;
    absl::Status removed = RemoveCheckpoint(target_.root, step, fs_);  // through a trash name
    if (!removed.ok() && !absl::IsNotFound(removed)) {
      Log(LogLevel::kWarning, absl::StrCat("tier: removing this rank's copy of step ", step,
                                           " (older than step ", durable, ", now in the bucket): ",
                                           removed.message()));
      return;
    }
  }
}

}  // namespace internal
}  // namespace ckpt
