// ObjectLease and ReclaimObjectOrphans (ckpt/object_tier.h).
#include <algorithm>
#include <cstdlib>
#include <map>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/random/random.h"
#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "ckpt/object_tier.h"
#include "format/names.h"
#include "util/cancellable_sleep.h"
#include "util/log.h"
#include "util/mutex.h"
#include "util/status_macros.h"

namespace ckpt {
namespace {

using internal::Log;
using internal::LogLevel;

// The payload that marks `Acquire`'s "held by another job" error.
constexpr absl::string_view kLeaseHeldPayload = "type.ckpt/ObjectLease.held";

absl::Status LeaseHeld(std::string message) {
  absl::Status status = absl::UnavailableError(std::move(message));
  status.SetPayload(kLeaseHeldPayload, absl::Cord("1"));
  return status;
}

std::string LeaseKey(absl::string_view prefix) {
  return prefix.empty() ? std::string(".ckpt-retain.lease") : absl::StrCat(prefix, "/.ckpt-retain.lease");
}

std::string LeaseBody(absl::string_view owner, const std::string& nonce, absl::Time expires) {
  nlohmann::ordered_json j;
  j["owner"] = std::string(owner);
  j["nonce"] = nonce;
  j["expires_unix_ns"] = absl::ToUnixNanos(expires);
  return j.dump();
}

// After creating `key` with `body` conditionally: creates it once more with
// `If-None-Match: *`, which a store that honours the condition refuses. One
// that accepts it cannot keep two jobs apart: the lease just taken is
// released and the error says so (a warning with CKPT_S3_UNCONDITIONAL_LEASE=1).
absl::Status CheckConditionalWrites(ObjectStore& store, const std::string& key, const std::string& body) {
  auto release = [&] {
    if (absl::Status s = store.Delete(key); !s.ok()) {
      Log(LogLevel::kWarning, absl::StrCat("releasing lease ", key, ": ", s.message()));
    }
  };
  auto again = store.Put(key, body, {true, {}});
  if (absl::IsAlreadyExists(again.status())) return absl::OkStatus();
  if (!again.ok()) {
    // Not known either way: the job stops, and does not keep the lease for
    // its whole duration.
    release();
    return again.status();
  }
  const std::string what = absl::StrCat(
      "s3://", store.bucket(), "/", key, ": ", store.Describe(),
      " ignored `If-None-Match: *` (a second conditional create of the lease succeeded), so it cannot "
      "keep two jobs from working on one prefix at once, nor one commit marker from replacing another");
  const char* allow = std::getenv("CKPT_S3_UNCONDITIONAL_LEASE");
  if (allow != nullptr && std::string(allow) == "1") {
    Log(LogLevel::kWarning, absl::StrCat(what, "; going on (CKPT_S3_UNCONDITIONAL_LEASE=1): one job per "
                                               "prefix is up to you"));
    return absl::OkStatus();
  }
  release();
  return absl::FailedPreconditionError(absl::StrCat(
      what, ". Use a store that honours conditional writes (AWS S3, Cloudflare R2, current MinIO, Ceph RGW "
            "19 and later), or, if you keep one job per prefix by other means, set "
            "CKPT_S3_UNCONDITIONAL_LEASE=1"));
}

}  // namespace

// Renews the lease every duration / 3 while it is ours, on a thread of its own.
class ObjectLease::Renewer {
 public:
  Renewer(ObjectStore* store, std::string key, std::string owner, std::string nonce, std::string body,
          absl::Duration duration)
      : store_(store),
        key_(std::move(key)),
        owner_(std::move(owner)),
        nonce_(std::move(nonce)),
        body_(std::move(body)),
        duration_(duration) {
    if (duration_ > absl::ZeroDuration()) thread_ = std::thread([this] { Run(); });
  }
  ~Renewer() {
    {
      internal::MutexLock lock(&mu_);
      stop_ = true;
    }
    if (thread_.joinable()) thread_.join();
  }
  std::string body() const {
    internal::MutexLock lock(&mu_);
    return body_;
  }
  int renewals() const {
    internal::MutexLock lock(&mu_);
    return renewals_;
  }

 private:
  void Run() {
    while (true) {
      {
        internal::MutexLock lock(&mu_);
        if (mu_.AwaitWithTimeout([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stop_; }, duration_ / 3)) {
          return;
        }
      }
      // Still ours? (Read first: a lease taken over after it expired -- this
      // process stalled past it -- is not rewritten.)
      const std::string mine = body();
      auto held = store_->Get(key_);
      if (!held.ok() || *held != mine) {
        Log(LogLevel::kWarning, absl::StrCat("lease s3://", store_->bucket(), "/", key_, " is not ours any more (",
                                             held.ok() ? "another job holds it" : held.status().message(),
                                             "); not renewing it"));
        return;
      }
      const std::string next = LeaseBody(owner_, nonce_, absl::Now() + duration_);
      auto put = store_->Put(key_, next, {false, {}});
      if (!put.ok()) {
        Log(LogLevel::kWarning, absl::StrCat("renewing lease s3://", store_->bucket(), "/", key_, ": ",
                                             put.status().message(), " (trying again later)"));
        continue;
      }
      internal::MutexLock lock(&mu_);
      body_ = next;
      ++renewals_;
    }
  }

  ObjectStore* const store_;
  const std::string key_;
  const std::string owner_, nonce_;  // what the body says besides its expiry
  mutable internal::Mutex mu_;
  std::string body_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int renewals_ ABSL_GUARDED_BY(mu_) = 0;
  const absl::Duration duration_;
  std::thread thread_;
};

ObjectLease::ObjectLease(std::shared_ptr<ObjectStore> store, std::string key, std::string owner,
                         std::string nonce, std::string body, absl::Duration duration)
    : store_(std::move(store)),
      key_(std::move(key)),
      renewer_(std::make_unique<Renewer>(store_.get(), key_, std::move(owner), std::move(nonce),
                                         std::move(body), duration)) {}

int ObjectLease::renewals() const { return renewer_->renewals(); }

absl::StatusOr<std::unique_ptr<ObjectLease>> ObjectLease::Acquire(std::shared_ptr<ObjectStore> store,
                                                                  absl::string_view prefix,
                                                                  absl::string_view owner,
                                                                  absl::Duration duration) {
  const std::string key = LeaseKey(prefix);
  absl::BitGen gen;
  const std::string nonce = absl::StrFormat("%016x", absl::Uniform<uint64_t>(gen));
  const std::string body = LeaseBody(owner, nonce, absl::Now() + duration);
  auto held_by_us = [&] {
    return std::unique_ptr<ObjectLease>(new ObjectLease(store, key, std::string(owner), nonce, body, duration));
  };
  for (int attempt = 0; attempt < 2; ++attempt) {
    auto put = store->Put(key, body, {true, {}});
    if (put.ok()) {
      CKPT_RETURN_IF_ERROR(CheckConditionalWrites(*store, key, body));
      return held_by_us();
    }
    if (!absl::IsAlreadyExists(put.status())) return put.status();
    auto held = store->Get(key);
    if (!held.ok()) {
      if (absl::IsNotFound(held.status())) continue;  // released meanwhile: try again
      return held.status();
    }
    // Our own write, its response lost and the retry refused.
    if (*held == body) return held_by_us();
    nlohmann::json h = nlohmann::json::parse(*held, nullptr, false);
    const std::string holder = h.is_object() ? h.value("owner", "?") : "?";
    const int64_t expires = h.is_object() ? h.value("expires_unix_ns", int64_t{0}) : 0;
    if (absl::FromUnixNanos(expires) > absl::Now()) {
      return LeaseHeld(absl::StrCat(
          "s3://", store->bucket(), "/", key, " is held by ", holder, " until ",
          absl::FormatTime(absl::FromUnixNanos(expires), absl::UTCTimeZone()),
          ": another job is working on this prefix; run again after it finishes"));
    }
    Log(LogLevel::kWarning, absl::StrCat("taking over the expired lease s3://", store->bucket(), "/",
                                         key, " of ", holder));
    CKPT_RETURN_IF_ERROR(store->Delete(key));
  }
  return absl::UnavailableError(
      absl::StrCat("s3://", store->bucket(), "/", key, ": lease contended; run again"));
}

absl::StatusOr<std::unique_ptr<ObjectLease>> ObjectLease::AcquireWaiting(
    std::shared_ptr<ObjectStore> store, absl::string_view prefix, absl::string_view owner,
    absl::Duration duration, absl::Duration wait, const std::function<bool()>& cancelled) {
  const absl::Time start = absl::Now();
  absl::Duration pause = absl::Seconds(1);
  for (bool logged = false;; logged = true) {
    auto lease = Acquire(store, prefix, owner, duration);
    if (lease.ok() || !IsLeaseHeld(lease.status())) return lease;
    const absl::Duration waited = absl::Now() - start;
    if (waited >= wait) {
      if (wait == absl::ZeroDuration()) return lease;
      return LeaseHeld(absl::StrCat(lease.status().message(), " (waited ",
                                    absl::FormatDuration(absl::Trunc(waited, absl::Seconds(1))),
                                    " for it)"));
    }
    if (!logged) Log(LogLevel::kInfo, absl::StrCat(lease.status().message(), "; waiting for it"));
    if (!internal::SleepUnlessCancelled(std::min(pause, wait - waited), cancelled)) {
      return absl::CancelledError(absl::StrCat("cancelled while waiting for the lease: ",
                                               lease.status().message()));
    }
    pause = std::min(pause * 2, absl::Seconds(10));
  }
}

bool IsLeaseHeld(const absl::Status& status) {
  return absl::IsUnavailable(status) && status.GetPayload(kLeaseHeldPayload).has_value();
}

ObjectLease::~ObjectLease() {
  const std::string body = renewer_->body();
  renewer_.reset();  // no renewal from here on
  // Only our own lease is removed (one taken over after it expired is not).
  // (Read twice before giving up: a body damaged on the way must not leave
  // our lease behind for its whole duration.)
  for (int attempt = 0; attempt < 2; ++attempt) {
    auto held = store_->Get(key_);
    if (!held.ok() && absl::IsNotFound(held.status())) return;
    if (held.ok() && *held == body) {
      absl::Status s = store_->Delete(key_);
      if (!s.ok()) Log(LogLevel::kWarning, absl::StrCat("releasing lease: ", s.message()));
      return;
    }
  }
  Log(LogLevel::kWarning, absl::StrCat("lease s3://", store_->bucket(), "/", key_,
                                       " is not ours any more (or unreadable); left in place"));
}

absl::StatusOr<ObjectReclaimStats> ReclaimObjectOrphans(ObjectStore& store, absl::string_view prefix,
                                                        absl::Duration stale_upload_age) {
  ObjectReclaimStats stats;
  const std::string dir = prefix.empty() ? "" : absl::StrCat(prefix, "/");
  auto step_of = [&](absl::string_view key) -> std::optional<int64_t> {
    if (!absl::ConsumePrefix(&key, dir)) return std::nullopt;
    const size_t slash = key.find('/');
    if (slash == absl::string_view::npos) return std::nullopt;
    return internal::ParseCheckpointDirName(key.substr(0, slash));
  };
  CKPT_ASSIGN_OR_RETURN(std::vector<int64_t> committed, ListCommittedSteps(store, prefix));
  const std::set<int64_t> marked(committed.begin(), committed.end());
  CKPT_ASSIGN_OR_RETURN(std::vector<MultipartUploadInfo> uploads, store.ListMultipartUploads(dir));
  const absl::Time now = absl::Now();
  for (const MultipartUploadInfo& u : uploads) {
    auto step = step_of(u.key);
    if (!step.has_value()) continue;
    if (marked.count(*step) == 0) {
      // An unfinished step: its upload is resumed by the next publish
      // unless it is old (an unparsable time counts as old).
      absl::Time initiated;
      std::string error;
      if (absl::ParseTime(absl::RFC3339_full, u.initiated, &initiated, &error) &&
          now - initiated < stale_upload_age) {
        continue;
      }
    }
    CKPT_RETURN_IF_ERROR(store.AbortMultipartUpload(u.key, u.upload_id));
    ++stats.uploads_aborted;
  }
  CKPT_ASSIGN_OR_RETURN(ObjectListing all, store.List(dir, ""));
  for (const ObjectInfo& o : all.objects) {
    auto step = step_of(o.key);
    if (!step.has_value() || marked.count(*step) > 0) continue;
    // Only what ckpt uploaded (it tags every object); never a hand copy.
    CKPT_ASSIGN_OR_RETURN(ObjectInfo head, store.Head(o.key));
    if (head.metadata.count("ckpt-xxh3") == 0) continue;
    CKPT_RETURN_IF_ERROR(store.Delete(o.key));
    ++stats.objects_deleted;
  }
  return stats;
}

}  // namespace ckpt
