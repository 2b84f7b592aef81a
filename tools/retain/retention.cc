// tools/retain/retention.cc: the retention/tiering job (see retention.h).
#include "retain/retention.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <set>

#include <unistd.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/random/random.h"
#include "absl/time/clock.h"
#include "ckpt/catalog.h"
#include "ckpt/compact.h"
#include "ckpt/maintenance.h"
#include "ckpt/object_store.h"
#include "ckpt/object_tier.h"
#include "ckpt/root_lock.h"
#include "retain/plan.h"

namespace ckpt::tools {
namespace {

// A manifest that could not be read (an I/O error, not damage) might be a
// delta of any older step: planning around it could delete its bases, so
// nothing is planned at all.
absl::Status RequireReadableManifests(const std::vector<CheckpointSummary>& listed) {
  for (const CheckpointSummary& c : listed) {
    const absl::StatusCode code = c.manifest_status.code();
    if (!c.manifest_status.ok() && code != absl::StatusCode::kDataLoss &&
        code != absl::StatusCode::kNotFound) {
      return absl::Status(code, absl::StrCat("cannot read the manifest of step ", c.step,
                                             ", so nothing is changed: ", c.manifest_status.message()));
    }
  }
  return absl::OkStatus();
}

namespace stdfs = std::filesystem;

absl::Status Prefixed(absl::string_view what, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat(what, ": ", status.message()));
}

// Whether `cold` already holds checkpoint `hot` complete -- a copy (the same
// manifest) or its compaction -- as an interrupted earlier run leaves it: a
// directory appears there under its final name only once complete.
absl::StatusOr<bool> AlreadyInCold(const std::shared_ptr<FileSystem>& fs, const std::string& cold,
                                   const CheckpointSummary& hot) {
  auto there = SummarizeCheckpoint(cold, hot.step, fs);
  if (!there.ok()) {
    if (absl::IsNotFound(there.status())) return false;
    return there.status();
  }
  const std::string dir = cold + "/" + StepDirName(hot.step);
  if (!there->manifest_status.ok()) {
    return absl::AlreadyExistsError(absl::StrCat(dir, " already exists and is damaged: ",
                                                 there->manifest_status.message()));
  }
  if (there->manifest_xxh3 == hot.manifest_xxh3 ||
      (there->compacted && there->compacted_from_manifest_xxh3 == hot.manifest_xxh3)) {
    return true;
  }
  return absl::AlreadyExistsError(dir + " already exists and holds another checkpoint");
}

// A bucket as the cold tier (`--cold-dir s3://bucket/prefix`).
struct BucketTier {
  std::shared_ptr<ObjectStore> store;
  std::string prefix;
  PublishOptions publish;
};

// Places checkpoint `hot` under the bucket prefix (as it is, or with
// `compact` as a full checkpoint compacted into a local staging root
// ROOT/.tmp-tier-<nonce> first, job debris if we die), unless an interrupted
// earlier run already did: its marker names the same manifest, or this
// delta's compaction. ROOT's checkpoint is not changed.
absl::Status PlaceInBucket(const std::shared_ptr<FileSystem>& fs, const std::string& root,
                           const CheckpointSummary& hot, const BucketTier& tier, bool compact) {
  auto marker = ReadCommitMarker(*tier.store, tier.prefix, hot.step);
  // A damaged marker commits nothing: PublishCheckpoint replaces it.
  if (!marker.ok() && !absl::IsDataLoss(marker.status())) return marker.status();
  if (marker.ok() && marker->has_value()) {
    const CommitMarker& m = **marker;
    if (m.manifest_xxh3 == hot.manifest_xxh3 ||
        (m.compacted && m.compacted_from_manifest_xxh3 == hot.manifest_xxh3)) {
      return absl::OkStatus();
    }
    return absl::AlreadyExistsError(absl::StrCat("s3://", tier.store->bucket(), "/",
                                                 MarkerKey(tier.prefix, hot.step),
                                                 " commits another checkpoint"));
  }
  PublishOptions publish = tier.publish;
  publish.fs = fs;
  if (!compact) return PublishCheckpoint(root, hot.step, *tier.store, tier.prefix, publish).status();
  absl::BitGen gen;
  const std::string staging =
      absl::StrFormat("%s/.tmp-tier-%016x", root, absl::Uniform<uint64_t>(gen));
  if (absl::Status s = fs->CreateDir(staging); !s.ok()) return s;
  CompactOptions options;
  options.target_root = staging;
  options.fs = fs;
  options.holds_retention_lock = true;
  absl::Status status = CompactToFull(root, hot.step, options).status();
  if (status.ok()) {
    status = PublishCheckpoint(staging, hot.step, *tier.store, tier.prefix, publish).status();
  }
  absl::Status removed = RemoveTree(*fs, staging);  // else the next run's debris
  return status.ok() ? removed : status;
}

// Places checkpoint `hot` in `cold` (as it is, or with `compact` as a full
// checkpoint), unless an interrupted earlier run already did. ROOT is not
// changed: the hot copy is removed afterwards.
absl::Status PlaceInCold(const std::shared_ptr<FileSystem>& fs, const std::string& root,
                         const CheckpointSummary& hot, const std::string& cold, bool compact,
                         const BucketTier* bucket) {
  if (bucket != nullptr) return PlaceInBucket(fs, root, hot, *bucket, compact);
  auto there = AlreadyInCold(fs, cold, hot);
  if (!there.ok()) return there.status();
  if (*there) return absl::OkStatus();
  if (compact) {
    CompactOptions options;
    options.target_root = cold;
    options.fs = fs;
    options.holds_retention_lock = true;  // of ROOT and of `cold`
    return CompactToFull(root, hot.step, options).status();
  }
  return CopyCheckpoint(root, hot.step, cold, fs).status();
}

// How long ago anything in `path` (an entry of a root) last changed: a save
// in progress keeps writing inside its temp dir, so its age is that of the
// most recently modified thing in it. Unknown: zero.
absl::Duration Age(FileSystem& fs, const std::string& path, absl::Time now) {
  auto stat = fs.Stat(path);
  if (!stat.ok()) return absl::ZeroDuration();
  int64_t newest_ns = stat->mtime_ns;
  if (stat->is_directory && !stat->is_symlink) {
    auto inner = fs.ListDir(path);
    for (const std::string& file : inner.ok() ? *inner : std::vector<std::string>{}) {
      auto inner_stat = fs.Stat(absl::StrCat(path, "/", file));
      if (inner_stat.ok()) newest_ns = std::max(newest_ns, inner_stat->mtime_ns);
    }
  }
  return now - absl::FromUnixNanos(newest_ns);
}

RetentionAction Orphan(const std::string& name, absl::string_view reason, uint64_t bytes) {
  RetentionAction a{RetentionAction::Kind::kRemoveStale, name, -1, std::string(reason), false, ""};
  a.bytes = bytes;
  return a;
}

// The saves in progress (`.tmp-step-*`) of `root`. With no writer alive --
// its lock taken, here, without waiting -- they are a dead writer's: each is
// renamed to a `.trash-` name and ROOT fsynced, the writer lock released at
// once (a trainer starting now is refused only for those renames), and the
// trash is left for `ReclaimOrphans`; `trashed` maps each trash name to the
// temp it was. With a writer alive, only those untouched for
// `policy.stale_temp_age` go (a writer hung for that long); the writer's
// saves in progress are otherwise never touched. A dry run renames nothing.
std::vector<RetentionAction> SaveTemps(const std::shared_ptr<FileSystem>& fs, const std::string& root,
                                       const RetentionPolicy& policy, absl::Time now,
                                       std::map<std::string, std::string>& trashed) {
  std::vector<RetentionAction> actions;
  auto names = fs->ListDir(root);
  if (!names.ok()) return actions;
  std::sort(names->begin(), names->end());
  std::vector<std::string> temps;
  for (const std::string& name : *names) {
    if (ClassifyRootEntry(name) == RootEntryKind::kSaveTemp) temps.push_back(name);
  }
  if (temps.empty()) return actions;  // no need to touch the writer's lock
  auto writer = LockRoot(root, RootLockKind::kWriter, "ckpt-retain", fs.get());
  if (writer.ok()) {
    constexpr absl::string_view kDead = "a save its writer did not finish; no writer holds the lock";
    if (policy.dry_run) {
      writer->reset();
      for (const std::string& name : temps) {
        actions.push_back(Orphan(name, kDead, TreeBytes(*fs, root + "/" + name).value_or(0)));
      }
      return actions;
    }
    auto moved = TrashSaveTemps(root, fs);
    writer->reset();  // the renames are done: a trainer may open ROOT again
    if (!moved.ok()) {
      RetentionAction a = Orphan(".tmp-step-*", kDead, 0);
      a.error = std::string(moved.status().message());
      actions.push_back(std::move(a));
      return actions;
    }
    for (const TrashedSaveTemp& t : *moved) trashed[t.trash] = t.name;
    return actions;  // reported with the trash they became
  }
  // A writer is alive (or its lock cannot be used: no proof that none is).
  for (const std::string& name : temps) {
    const std::string path = root + "/" + name;
    const absl::Duration age = Age(*fs, path, now);
    if (age < policy.stale_temp_age) continue;
    RetentionAction a = Orphan(
        name,
        absl::StrCat("untouched for ", absl::FormatDuration(absl::Trunc(age, absl::Seconds(1))),
                     " while a writer holds the lock"),
        TreeBytes(*fs, path).value_or(0));
    if (!policy.dry_run) {
      absl::Status s = RemoveTree(*fs, path);
      a.done = s.ok() || absl::IsNotFound(s);
      if (!a.done) a.error = std::string(s.message());
    }
    actions.push_back(std::move(a));
  }
  return actions;
}

// The orphans of dead jobs in `dir` (ROOT or the cold tier, whose retention
// lock this job holds: no compaction, copy or removal of another job can be
// running there), removed whatever their age (listed in a dry run). Names
// are `prefix` + the entry; `trashed` names the save temps that became trash.
std::vector<RetentionAction> JobDebris(const std::shared_ptr<FileSystem>& fs, const std::string& dir,
                                       const std::string& prefix, bool dry_run,
                                       const std::map<std::string, std::string>& trashed) {
  std::vector<RetentionAction> actions;
  ReclaimScope scope;
  scope.job_debris = true;
  scope.dry_run = dry_run;
  auto reclaimed = ReclaimOrphans(dir, scope, fs);
  if (!reclaimed.ok()) return actions;
  for (const ReclaimedEntry& e : reclaimed->entries) {
    auto it = trashed.find(e.name);
    RetentionAction a =
        it != trashed.end()
            ? Orphan(prefix + it->second, "a save its writer did not finish; no writer holds the lock", e.bytes)
            : Orphan(prefix + e.name,
                     absl::StrCat(RootEntryKindName(e.kind), " of a dead job; this job holds the retention lock"),
                     e.bytes);
    a.done = e.status.ok() && !dry_run;
    if (!e.status.ok()) a.error = std::string(e.status.message());
    actions.push_back(std::move(a));
  }
  return actions;
}

// Carries out `plan` in three passes, so that every listed checkpoint, in
// ROOT and in the cold tier, restores at every moment (a crash anywhere
// leaves nothing broken behind):
// 1. compactions (a failed one keeps the bases it would have freed);
// 2. what moves is placed in the cold tier, oldest first, so that a base is
//    there before its dependants (a base that fails to leave stays hot,
//    which its dependants' way out takes into account);
// 3. what leaves ROOT (deleted, or moved and placed) is removed, newest
//    first, so that dependants go before their bases; a step that a delta
//    still in ROOT is based on stays (its dependant failed to leave).
void Execute(const std::shared_ptr<FileSystem>& fs, const std::string& root,
             const RetentionPolicy& policy, const BucketTier* bucket, RetentionPlan& plan,
             std::map<int64_t, RetentionAction>& actions) {
  using Kind = RetentionAction::Kind;
  auto& steps = plan.steps();
  std::map<int64_t, int64_t> base_of;  // of every delta in ROOT, as it is now
  for (const auto& [step, planned] : steps) {
    const CheckpointSummary* summary = plan.Find(step);
    if (summary != nullptr && summary->manifest_status.ok() && summary->kind == CheckpointKind::kDelta) {
      base_of[step] = summary->base_step;
    }
  }
  for (auto& [step, planned] : steps) {
    if (planned.kind != Kind::kCompact) continue;
    RetentionAction& a = actions[step];
    CompactOptions options;
    options.fs = fs;
    options.holds_retention_lock = true;
    auto stats = CompactToFull(root, step, options);
    a.done = stats.ok();
    if (stats.ok()) {
      base_of.erase(step);  // a full checkpoint now
      continue;
    }
    a.error = std::string(stats.status().message());
    for (int64_t base : planned.frees) {
      const std::string why = absl::StrCat("base of kept delta ", step, ", whose compaction failed");
      steps[base] = PlannedStep{Kind::kKeep, why, {}};
      actions[base] = {Kind::kKeep, StepDirName(base), base, why, true, ""};
    }
  }
  std::set<int64_t> stayed;  // failed to leave
  auto stays_hot = [&](int64_t step) {
    if (stayed.count(step) != 0) return true;
    auto it = steps.find(step);
    return it != steps.end() &&
           (it->second.kind == Kind::kKeep || it->second.kind == Kind::kCompact ||
            it->second.kind == Kind::kSkipDamaged);
  };
  std::vector<int64_t> leaving;  // placed in the cold tier, or to be deleted
  for (auto& [step, planned] : steps) {
    if (planned.kind == Kind::kMove || planned.kind == Kind::kCompactMove) {
      planned = plan.Leave(step, stays_hot);  // a base may have failed to leave
    }
    RetentionAction& a = actions[step];
    a.kind = planned.kind;
    a.reason = planned.reason;
    switch (planned.kind) {
      case Kind::kKeep: a.done = true; continue;
      case Kind::kDelete: leaving.push_back(step); continue;
      case Kind::kMove:
      case Kind::kCompactMove: break;
      default: continue;
    }
    absl::Status placed = PlaceInCold(fs, root, *plan.Find(step), policy.cold_dir,
                                      planned.kind == Kind::kCompactMove, bucket);
    if (placed.ok()) {
      leaving.push_back(step);
    } else {
      a.error = std::string(placed.message());
      stayed.insert(step);
    }
  }
  std::reverse(leaving.begin(), leaving.end());
  std::set<int64_t> removed;
  for (int64_t step : leaving) {
    RetentionAction& a = actions[step];
    for (const auto& [dependant, base] : base_of) {
      if (base == step && removed.count(dependant) == 0) {
        a.error = absl::StrCat("not removed from ROOT: delta step ", dependant,
                               " there is based on it (it failed to leave)");
        break;
      }
    }
    if (!a.error.empty()) continue;
    absl::Status s = RemoveCheckpoint(root, step, fs);
    a.done = s.ok();
    if (s.ok()) {
      removed.insert(step);
    } else {
      a.error = std::string(s.message());
    }
  }
}

// Retention on a bucket prefix (`--root s3://...`): the same rules over the
// steps committed there, no compaction (a bucket rewrites nothing), under the
// prefix's lease. A step goes newest first, marker first -- it is then
// invisible, like a `.trash-` directory -- then the objects its marker lists
// (nothing else: an object put there by other means stays). A run that dies
// in between leaves unmarked ckpt objects, reclaimed by the next run.
absl::StatusOr<std::vector<RetentionAction>> RunBucketRetention(const std::string& root,
                                                                const RetentionPolicy& given) {
  using Kind = RetentionAction::Kind;
  if (!given.cold_dir.empty()) {
    return absl::InvalidArgumentError(
        "--cold-dir with an s3:// --root: a bucket is the last tier here (not supported)");
  }
  auto url = ParseObjectUrl(root);
  if (!url.ok()) return url.status();
  std::shared_ptr<ObjectStore> store = given.cold_store;
  if (store == nullptr) {
    auto opened = OpenObjectStore(root, {});
    if (!opened.ok()) return opened.status();
    store = *opened;
  }
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  auto lease = ObjectLease::AcquireWaiting(store, url->prefix,
                                           absl::StrCat("ckpt-retain pid ", getpid(), " on ", host),
                                           given.lease_duration, given.lease_wait);
  if (!lease.ok()) return lease.status();
  std::vector<RetentionAction> stale;
  if (!given.dry_run) {
    auto reclaimed = ReclaimObjectOrphans(*store, url->prefix);
    if (!reclaimed.ok()) return reclaimed.status();
    if (reclaimed->uploads_aborted + reclaimed->objects_deleted > 0) {
      stale.push_back({Kind::kRemoveStale, root, -1,
                       absl::StrCat(reclaimed->uploads_aborted, " multipart uploads aborted, ",
                                    reclaimed->objects_deleted, " unmarked objects deleted"),
                       true, "", 0});
    }
  }
  auto fs = ObjectFileSystem(store);
  if (!fs.ok()) return fs.status();
  auto listed = ListCheckpoints(root, *fs);
  if (!listed.ok()) return listed.status();
  if (absl::Status s = RequireReadableManifests(*listed); !s.ok()) return s;
  RetentionPolicy policy = given;
  policy.compact = false;
  RetentionPlan plan(*listed, std::nullopt, policy, absl::Now());
  std::map<int64_t, RetentionAction> actions;
  std::map<int64_t, int64_t> base_of;
  std::vector<int64_t> leaving;
  for (const auto& [step, planned] : plan.steps()) {
    actions[step] = {planned.kind, StepDirName(step), step, planned.reason,
                     planned.kind == Kind::kKeep, ""};
    const CheckpointSummary* summary = plan.Find(step);
    if (summary != nullptr && summary->manifest_status.ok() && summary->kind == CheckpointKind::kDelta) {
      base_of[step] = summary->base_step;
    }
    if (planned.kind == Kind::kDelete) leaving.push_back(step);
  }
  if (!policy.dry_run) {
    std::reverse(leaving.begin(), leaving.end());  // dependants before their bases
    std::set<int64_t> removed;
    for (int64_t step : leaving) {
      RetentionAction& a = actions[step];
      for (const auto& [dependant, base] : base_of) {
        if (base == step && removed.count(dependant) == 0 && actions[dependant].kind != Kind::kKeep) {
          a.error = absl::StrCat("not removed: delta step ", dependant, " is based on it (it failed to go)");
        }
      }
      if (!a.error.empty()) continue;
      absl::Status s = [&]() -> absl::Status {
        auto marker = ReadCommitMarker(*store, url->prefix, step);
        if (!marker.ok()) return marker.status();
        if (!marker->has_value()) return absl::OkStatus();  // gone meanwhile
        if (absl::Status d = store->Delete(MarkerKey(url->prefix, step)); !d.ok()) return d;
        for (const CommitMarker::File& f : (*marker)->files) {
          absl::Status d = store->Delete(absl::StrCat(StepPrefix(url->prefix, step), "/", f.name));
          if (!d.ok()) return d;  // unmarked now: the next run reclaims the rest
        }
        return absl::OkStatus();
      }();
      a.done = s.ok();
      if (s.ok()) {
        removed.insert(step);
      } else {
        a.error = std::string(s.message());
      }
    }
  }
  std::vector<RetentionAction> result;
  for (auto& [step, a] : actions) result.push_back(std::move(a));
  for (RetentionAction& a : stale) result.push_back(std::move(a));
  return result;
}

}  // namespace

const char* ActionName(RetentionAction::Kind kind) {
  switch (kind) {
    case RetentionAction::Kind::kKeep: return "keep";
    case RetentionAction::Kind::kCompact: return "compact";
    case RetentionAction::Kind::kMove: return "move";
    case RetentionAction::Kind::kCompactMove: return "compact-move";
    case RetentionAction::Kind::kDelete: return "delete";
    case RetentionAction::Kind::kRemoveStale: return "remove-stale";
    case RetentionAction::Kind::kSkipDamaged: return "skip-damaged";
  }
  return "";
}

absl::StatusOr<std::vector<RetentionAction>> RunRetention(const std::string& root,
                                                          const RetentionPolicy& policy) {
  if (IsObjectUrl(root)) return RunBucketRetention(root, policy);
  const std::shared_ptr<FileSystem> fs = policy.fs != nullptr ? policy.fs : PosixFileSystem();
  // OK if `path` is a directory; kNotFound naming `what` if it is not (or is
  // missing); the file system's error otherwise.
  auto require_directory = [&](const std::string& path, absl::string_view what) -> absl::Status {
    auto stat = fs->Stat(path);
    if (!stat.ok() && !absl::IsNotFound(stat.status())) return stat.status();
    if (!stat.ok() || !stat->is_directory) {
      return absl::NotFoundError(absl::StrCat(what, " ", path, " is not a directory"));
    }
    return absl::OkStatus();
  };
  if (absl::Status s = require_directory(root, "checkpoint root"); !s.ok()) return s;
  const bool to_bucket = IsObjectUrl(policy.cold_dir);
  std::unique_ptr<BucketTier> bucket;
  if (to_bucket) {
    auto url = ParseObjectUrl(policy.cold_dir);
    if (!url.ok()) return url.status();
    bucket = std::make_unique<BucketTier>();
    bucket->prefix = url->prefix;
    bucket->store = policy.cold_store;
    if (bucket->store == nullptr) {
      ObjectStoreOptions options;
      options.max_send_bytes_per_second = policy.max_upload_bytes_per_second;
      auto store = OpenObjectStore(policy.cold_dir, options);
      if (!store.ok()) return Prefixed("--cold-dir", store.status());
      bucket->store = *store;
    }
    bucket->publish.streams = policy.upload_streams;
    bucket->publish.part_bytes = policy.upload_part_bytes;
    bucket->publish.read_back = policy.upload_read_back;
    bucket->publish.storage_class = policy.upload_storage_class;
  }
  if (!policy.cold_dir.empty() && !to_bucket) {
    if (absl::Status s = require_directory(policy.cold_dir, "--cold-dir"); !s.ok()) return s;
    // Path resolution only (it writes nothing): whether the two nest.
    std::error_code ec;
    const stdfs::path r = stdfs::canonical(root, ec), c = stdfs::canonical(policy.cold_dir, ec);
    if (ec) return absl::InvalidArgumentError(absl::StrCat("resolving ", root, " and ", policy.cold_dir, ": ", ec.message()));
    auto [ri, ci] = std::mismatch(r.begin(), r.end(), c.begin(), c.end());
    if (r == c || ri == r.end() || ci == c.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--cold-dir ", policy.cold_dir, " must be a different directory, not inside or around ", root));
    }
  }
  // A rank's own copy (ranks that share no file system): none of its steps
  // is a whole checkpoint, and the rank's tier prunes them itself.
  if (auto rank = RankCopyOf(root, fs); rank.ok() && rank->has_value()) {
    return absl::FailedPreconditionError(absl::StrCat(
        DescribeRankCopy(root, **rank), ": ckpt-retain changes nothing here. The rank's tier removes its "
        "copies older than the newest step durable in the bucket; apply retention to the bucket instead "
        "(--root s3://BUCKET/PREFIX)"));
  }
  // One job at a time per root: everything below, compactions included,
  // happens under this lock.
  auto lock = LockRoot(root, RootLockKind::kRetention, "ckpt-retain", fs.get());
  if (!lock.ok()) return lock.status();  // kUnavailable: another job runs (exit code 4)
  // And of the cold tier: its `.tmp-copy-*`/`.tmp-compact-*` are then this
  // job's or a dead one's, never a live job's (another root's retention may
  // share the cold dir: it waits for the next run, as on ROOT).
  absl::StatusOr<std::unique_ptr<FileLock>> cold_lock;
  std::unique_ptr<ObjectLease> lease;
  if (to_bucket) {
    // A bucket has no flock: a lease object, one job per prefix.
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    auto taken = ObjectLease::AcquireWaiting(bucket->store, bucket->prefix,
                                             absl::StrCat("ckpt-retain pid ", getpid(), " on ", host,
                                                          " for ", root),
                                             policy.lease_duration, policy.lease_wait);
    if (!taken.ok()) return Prefixed("--cold-dir", taken.status());
    lease = std::move(*taken);
  } else if (!policy.cold_dir.empty()) {
    cold_lock = LockRoot(policy.cold_dir, RootLockKind::kRetention, "ckpt-retain", fs.get());
    if (!cold_lock.ok()) {
      return absl::Status(cold_lock.status().code(),
                          absl::StrCat("--cold-dir: ", cold_lock.status().message()));
    }
  }

  if (!policy.dry_run) {
    // A compaction that fell back to two renames and was interrupted between
    // them: put its checkpoint back before anything is listed.
    if (absl::Status s = FinishInterruptedCompactions(root, fs); !s.ok()) return s;
  }
  auto listed = ListCheckpoints(root, fs);
  if (!listed.ok()) return listed.status();
  if (absl::Status s = RequireReadableManifests(*listed); !s.ok()) return s;
  auto latest_file = fs->Stat(absl::StrCat(root, "/LATEST"));
  if (!latest_file.ok() && !absl::IsNotFound(latest_file.status())) return latest_file.status();
  const bool looks_like_root = latest_file.ok() || !listed->empty();
  if (!looks_like_root) {
    return absl::InvalidArgumentError(
        absl::StrCat(root, " holds no checkpoints and no LATEST: not a checkpoint root"));
  }
  auto hint = ReadLatestHint(root, fs);
  // The step LATEST names is protected: not knowing it, change nothing. (A
  // LATEST that is too large or not a regular file protects nothing.)
  if (!hint.ok() && !absl::IsDataLoss(hint.status()) && !absl::IsFailedPrecondition(hint.status())) {
    return absl::Status(hint.status().code(), absl::StrCat("cannot read ", root, "/LATEST, so nothing is changed: ",
                                                           hint.status().message()));
  }
  const absl::Time now = absl::Now();
  RetentionPlan plan(*listed, hint.ok() ? *hint : std::nullopt, policy, now);
  std::map<int64_t, RetentionAction> actions;
  for (const auto& [step, planned] : plan.steps()) {
    actions[step] = {planned.kind, StepDirName(step), step, planned.reason,
                     planned.kind == RetentionAction::Kind::kKeep, ""};
  }
  // Orphans first: freed space helps what follows (a cold tier filled by
  // an interrupted copy would fail the next copy too).
  std::map<std::string, std::string> trashed;
  std::vector<RetentionAction> stale = SaveTemps(fs, root, policy, now, trashed);
  for (RetentionAction& a : JobDebris(fs, root, "", policy.dry_run, trashed)) stale.push_back(std::move(a));
  if (to_bucket && !policy.dry_run) {
    // Dead jobs' multipart uploads and unmarked objects ckpt uploaded (never
    // anything put there by other means).
    auto reclaimed = ReclaimObjectOrphans(*bucket->store, bucket->prefix);
    RetentionAction a{RetentionAction::Kind::kRemoveStale, policy.cold_dir, -1,
                      "dead jobs' uploads in the bucket", reclaimed.ok(), "", 0};
    if (!reclaimed.ok()) {
      a.error = std::string(reclaimed.status().message());
      stale.push_back(std::move(a));
    } else if (reclaimed->uploads_aborted + reclaimed->objects_deleted > 0) {
      a.reason = absl::StrCat(reclaimed->uploads_aborted, " multipart uploads aborted, ",
                              reclaimed->objects_deleted, " unmarked objects deleted");
      stale.push_back(std::move(a));
    }
  } else if (!policy.cold_dir.empty()) {
    for (RetentionAction& a : JobDebris(fs, policy.cold_dir, policy.cold_dir + "/", policy.dry_run, {})) {
      stale.push_back(std::move(a));
    }
  }
  if (!policy.dry_run) Execute(fs, root, policy, bucket.get(), plan, actions);
  std::vector<RetentionAction> result;
  for (auto& [step, a] : actions) result.push_back(std::move(a));
  for (RetentionAction& a : stale) result.push_back(std::move(a));
  return result;
}

}  // namespace ckpt::tools
