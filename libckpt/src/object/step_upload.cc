// One step's upload behind the save: alone, or by a multi-rank engine's
// ranks together (object/step_upload.h).
#include "object/step_upload.h"

#include <algorithm>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "util/cancellable_sleep.h"
#include "util/status_macros.h"

namespace ckpt::internal {
namespace {

using json = nlohmann::json;

// How long rank 0 waits, at most, for every rank to have read the result
// before its upload ends (its process may host the store: if it exited
// first, a rank would find no result).
constexpr absl::Duration kSeenPatience = absl::Seconds(10);
// The slices the store is waited on in: short, because the engine's commits
// use the same store (a c10d client serves one call at a time), and so that
// a cancellation ends a wait soon.
constexpr absl::Duration kStoreSlice = absl::Milliseconds(100);

// Errors that another try cannot mend (a lease still held after
// `TierTarget::lease_wait` has been waited for already).
bool Permanent(const absl::Status& s) {
  if (IsLeaseHeld(s)) return true;
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kUnauthenticated:
      return true;
    default:
      return false;
  }
}

// `call()` up to `target.attempts` times (0.5 s, 1 s, ... between them) while
// its error may be transient; sets `*tries`.
template <typename Call>
auto WithRetries(const TierTarget& target, int* tries, Call call) -> decltype(call()) {
  for (int attempt = 1;; ++attempt) {
    *tries = attempt;
    auto result = call();
    if (result.ok() || Permanent(result.status()) || attempt >= std::max(1, target.attempts)) return result;
    if (!SleepUnlessCancelled(absl::Milliseconds(500) * attempt, target.cancelled, kStoreSlice)) {
      return absl::CancelledError(absl::StrCat("the engine was closed with kCancel while the upload "
                                               "waited to try again after: ", result.status().message()));
    }
  }
}

std::string EncodeError(const absl::Status& s, bool save_failed = false) {
  json j = {{"ok", false}, {"code", static_cast<int>(s.code())}, {"error", std::string(s.message())}};
  if (save_failed) j["save_failed"] = true;
  return j.dump();
}

absl::Status DecodeError(const json& j) {
  int code = j.value("code", static_cast<int>(absl::StatusCode::kUnknown));
  if (code <= 0 || code > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
    code = static_cast<int>(absl::StatusCode::kUnknown);
  }
  return absl::Status(static_cast<absl::StatusCode>(code), j.value("error", std::string("(no reason given)")));
}

// The keys of one save of one step in the coordination store.
class GroupKeys {
 public:
  GroupKeys(const TierGroup& group, int64_t step, int round)
      : group_(group), step_(step), base_(absl::StrCat(group.key_prefix, "/tier/", step, "/", round, "/")) {}

  absl::Status Set(const std::string& key, const std::string& value) const {
    absl::Status s = group_.store->Set(base_ + key, value);
    if (!s.ok()) return Annotate(s, "the coordination store");
    return s;
  }

  // `key`'s value, waited for in slices; nullopt after `patience`;
  // kCancelled once `target.cancelled()`.
  absl::StatusOr<std::optional<json>> Get(const TierTarget& target, const std::string& key,
                                          absl::Duration patience) const {
    const absl::Time deadline = absl::Now() + patience;
    while (true) {
      const absl::Duration left = std::max(absl::Milliseconds(1), std::min(kStoreSlice, deadline - absl::Now()));
      auto got = group_.store->Get(base_ + key, left);
      if (got.ok()) {
        json j = json::parse(*got, nullptr, /*allow_exceptions=*/false);
        if (!j.is_object()) {
          return absl::InternalError(absl::StrCat("unreadable ", key, " in the coordination store: ", *got));
        }
        return std::optional<json>(std::move(j));
      }
      if (!absl::IsDeadlineExceeded(got.status())) return Annotate(got.status(), "the coordination store");
      if (target.cancelled()) {
        return absl::CancelledError("the engine was closed with kCancel while the ranks waited for one another");
      }
      if (absl::Now() >= deadline) return std::optional<json>();
    }
  }

 private:
  const TierGroup& group_;
  const int64_t step_;
  const std::string base_;
};

// This rank's files, uploaded and checked: its report to rank 0.
json PublishPart(const TierTarget& target, const TierGroup& group, int64_t step, int* tries) {
  PublishOptions publish = target.publish;
  publish.part = group.rank;
  if (group.own_copy) publish.copy_of = group.rank;
  auto stats = WithRetries(target, tries, [&] {
    return PublishCheckpoint(target.root, step, *target.store, target.prefix, publish);
  });
  if (!stats.ok()) return json::parse(EncodeError(stats.status()));
  json files = json::array();
  for (const CommitMarker::File& f : stats->published) {
    files.push_back({{"name", f.name}, {"bytes", f.bytes}, {"xxh3", f.xxh3}});
  }
  return {{"ok", true}, {"files", std::move(files)}, {"bytes", stats->bytes},
          {"already_there", stats->already_there}};
}

// The files a part lists; kInternal for a malformed report.
absl::StatusOr<std::vector<CommitMarker::File>> FilesOf(const json& part, int rank) {
  std::vector<CommitMarker::File> files;
  const json* list = part.contains("files") ? &part["files"] : nullptr;
  if (list == nullptr || !list->is_array()) {
    return absl::InternalError(absl::StrCat("rank ", rank, "'s report lists no files"));
  }
  for (const json& f : *list) {
    if (!f.is_object() || !f.contains("name") || !f["name"].is_string() || !f.contains("bytes") ||
        !f["bytes"].is_number_unsigned() || !f.contains("xxh3") || !f["xxh3"].is_number_unsigned()) {
      return absl::InternalError(absl::StrCat("rank ", rank, "'s report has a file that is not "
                                              "{name, bytes, xxh3}: ", f.dump()));
    }
    files.push_back({f["name"].get<std::string>(), f["bytes"].get<uint64_t>(), f["xxh3"].get<uint64_t>()});
  }
  return files;
}

// Rank 0: the marker over every rank's files, or why not.
json CommitParts(const TierTarget& target, const TierGroup& group, int64_t step,
                 const std::vector<json>& reports, int* tries) {
  std::vector<std::string> failed;
  for (size_t r = 0; r < reports.size(); ++r) {
    if (!reports[r].value("ok", false)) {
      failed.push_back(absl::StrCat("rank ", r, ": ", DecodeError(reports[r]).message()));
    }
  }
  if (!failed.empty()) {
    return json::parse(EncodeError(absl::AbortedError(absl::StrCat(
        "no commit marker written, a rank's part did not upload: ", absl::StrJoin(failed, "; ")))));
  }
  std::vector<CommitMarker::File> published;
  uint64_t bytes = 0;
  bool already_there = true;
  for (size_t r = 0; r < reports.size(); ++r) {
    auto files = FilesOf(reports[r], static_cast<int>(r));
    if (!files.ok()) return json::parse(EncodeError(files.status()));
    published.insert(published.end(), files->begin(), files->end());
    bytes += reports[r].value("bytes", uint64_t{0});
    already_there = already_there && reports[r].value("already_there", false);
  }
  PublishOptions publish = target.publish;
  if (group.own_copy) publish.copy_of = group.rank;
  auto stats = WithRetries(target, tries, [&] {
    return CommitPublishedParts(target.root, step, *target.store, target.prefix, published, publish);
  });
  if (!stats.ok()) return json::parse(EncodeError(stats.status()));
  return {{"ok", true}, {"files", published.size() + stats->files}, {"bytes", bytes},
          {"already_there", already_there && stats->already_there}};
}

}  // namespace

absl::StatusOr<StepUploadResult> UploadStepAlone(const TierTarget& target, int64_t step, int* attempts) {
  StepUploadResult result;
  auto stats = WithRetries(target, attempts, [&]() -> absl::StatusOr<PublishStats> {
    auto lease = ObjectLease::AcquireWaiting(target.store, target.prefix, target.lease_owner,
                                             target.patience, target.lease_wait, target.cancelled);
    if (!lease.ok()) return lease.status();
    return PublishCheckpoint(target.root, step, *target.store, target.prefix, target.publish);
  });
  if (!stats.ok()) return stats.status();
  result.files = stats->files;
  result.bytes = stats->bytes;
  result.already_there = stats->already_there;
  return result;
}

absl::StatusOr<StepUploadResult> UploadStepAsGroup(const TierTarget& target, const TierGroup& group,
                                                   int64_t step, int round, int* attempts) {
  const GroupKeys keys(group, step, round);
  StepUploadResult result;
  *attempts = 0;
  std::unique_ptr<ObjectLease> lease;  // rank 0's, from before any part until the marker
  if (group.rank == 0) {
    auto taken = WithRetries(target, attempts, [&] {
      return ObjectLease::AcquireWaiting(target.store, target.prefix,
                                         absl::StrCat(target.lease_owner, " (", group.world_size, " ranks)"),
                                         target.patience, target.lease_wait, target.cancelled);
    });
    if (!taken.ok()) {
      const absl::Status why(taken.status().code(),
                             absl::StrCat("rank 0 could not take the bucket's lease: ", taken.status().message()));
      CKPT_RETURN_IF_ERROR(keys.Set("go", EncodeError(why)));
      return why;
    }
    lease = std::move(*taken);
    CKPT_RETURN_IF_ERROR(keys.Set("go", json{{"ok", true}}.dump()));
  } else {
    absl::StatusOr<std::optional<json>> waited = keys.Get(target, "go", target.patience);
    if (!waited.ok()) {
      // (Cancelled: so that rank 0 does not wait for this rank's part.)
      keys.Set(absl::StrCat("part/", group.rank), EncodeError(waited.status(), /*save_failed=*/true)).IgnoreError();
      return waited.status();
    }
    std::optional<json>& go = *waited;
    if (!go.has_value()) {
      return absl::DeadlineExceededError(
          absl::StrCat("no word from rank 0 within ", absl::FormatDuration(target.patience)));
    }
    if (!go->value("ok", false)) return DecodeError(*go);
  }
  int part_tries = 0;
  const json mine = PublishPart(target, group, step, &part_tries);
  *attempts = std::max(*attempts, part_tries);
  json outcome;
  if (group.rank != 0) {
    CKPT_RETURN_IF_ERROR(keys.Set(absl::StrCat("part/", group.rank), mine.dump()));
    CKPT_ASSIGN_OR_RETURN(std::optional<json> got, keys.Get(target, "result", target.patience));
    if (!got.has_value()) {
      return absl::DeadlineExceededError(
          absl::StrCat("no result from rank 0 within ", absl::FormatDuration(target.patience)));
    }
    CKPT_RETURN_IF_ERROR(keys.Set(absl::StrCat("seen/", group.rank), json{{"ok", true}}.dump()));
    outcome = std::move(*got);
  } else {
    std::vector<json> reports = {mine};
    for (int r = 1; r < group.world_size; ++r) {
      absl::StatusOr<std::optional<json>> got = keys.Get(target, absl::StrCat("part/", r), target.patience);
      if (!got.ok()) {
        // (Cancelled: so that the ranks do not wait for the result.)
        keys.Set("result", EncodeError(got.status())).IgnoreError();
        return got.status();
      }
      reports.push_back(got->has_value()
                            ? std::move(**got)
                            : json::parse(EncodeError(absl::DeadlineExceededError(absl::StrCat(
                                  "no report within ", absl::FormatDuration(target.patience))))));
    }
    int commit_tries = 0;
    outcome = CommitParts(target, group, step, reports, &commit_tries);
    *attempts = std::max(*attempts, commit_tries);
    CKPT_RETURN_IF_ERROR(keys.Set("result", outcome.dump()));
    lease.reset();
    for (int r = 1; r < group.world_size; ++r) {  // before this process may take the store away
      if (reports[r].value("save_failed", false)) continue;  // that rank is not waiting for the result
      auto seen = keys.Get(target, absl::StrCat("seen/", r), kSeenPatience);
      if (!seen.ok() || !seen->has_value()) break;
    }
  }
  if (!outcome.value("ok", false)) return DecodeError(outcome);
  result.files = outcome.value("files", uint64_t{0});
  result.bytes = mine.value("bytes", uint64_t{0});
  result.already_there = outcome.value("already_there", false);
  return result;
}

absl::Status ReportFailedSave(const TierGroup& group, int64_t step, int round, const absl::Status& why) {
  const GroupKeys keys(group, step, round);
  if (group.rank == 0) {
    return keys.Set("go", EncodeError(absl::Status(why.code(), absl::StrCat("rank 0: ", why.message()))));
  }
  return keys.Set(absl::StrCat("part/", group.rank), EncodeError(why, /*save_failed=*/true));
}

}  // namespace ckpt::internal
