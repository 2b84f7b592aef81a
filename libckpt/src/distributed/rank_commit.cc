// (Over 400 lines: one rank's side of the protocol in rank_commit.h, whose
// rank-0 and other-rank halves share the key layout and the encoding of
// outcomes; splitting them would spread one protocol over two files.)
#include "distributed/rank_commit.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/random/random.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "ckpt/root_lock.h"
#include "commit/commit.h"
#include "commit/publish.h"
#include "distributed/rank_layout.h"
#include "distributed/store_value.h"
#include "format/global_manifest.h"
#include "format/global_tensors.h"
#include "format/manifest.h"
#include "format/names.h"
#include "io/small_file.h"
#include "read/load_manifest.h"
#include "util/hash.h"
#include "util/kill_point.h"
#include "util/status_macros.h"

namespace ckpt::internal {
namespace {

using Json = nlohmann::json;

// (The decision and result values are distributed/store_value.h's.)
// How long one wait on the store lasts before a waiter checks whether its
// save was cancelled (or, rank 0, whether another rank aborted it).
constexpr absl::Duration kWaitSlice = absl::Seconds(1);
// The shortest wait asked of the store: a look at a key without waiting
// (some stores read a zero timeout as "their default", or "for ever").
constexpr absl::Duration kPeek = absl::Milliseconds(1);
// How long rank 0 waits, at most, for the other ranks to have read the result
// of a commit (`AwaitResultSeen`).
constexpr absl::Duration kResultSeenPatience = absl::Seconds(10);

// How long a rank retries reading rank 0's writer lock line in ROOT before
// it concludes that it does not see rank 0's ROOT (a file system shared
// through a network may show a file a moment after it was written).
constexpr absl::Duration kSharedRootPatience = absl::Seconds(3);
constexpr uint64_t kLockLineMax = 4096;

std::string WriterLockPath(const std::string& root) {
  return JoinPath(root, std::string(RootLockFileName(RootLockKind::kWriter)));
}

std::string ThisHost() {
  char name[256] = {};
  return gethostname(name, sizeof(name) - 1) == 0 ? std::string(name) : std::string("?");
}

// The status an abort decision `held` carries (or why it is not one).
absl::Status AbortReason(absl::string_view held) {
  absl::StatusOr<StoreValue> decided = DecodeStoreValue(held, "decision");
  if (!decided.ok()) return decided.status();
  if (decided->verdict != Verdict::kAbort) {
    return absl::InternalError(absl::StrCat("unexpected decision in the coordination store: ", held));
  }
  return decided->status;
}

std::string Seconds(absl::Duration d) { return absl::StrFormat("%.3g s", absl::ToDoubleSeconds(d)); }

// A store that cannot be reached usually means the rank hosting it died
// (torch's TCPStore lives in rank 0's process).
absl::Status LostStore(int rank, absl::string_view waiting_for, const absl::Status& error) {
  return absl::UnavailableError(absl::StrCat(
      "rank ", rank, " lost the coordination store while waiting for ", waiting_for,
      " (the store's host, rank 0 under torch.distributed, may have died): ", error.message()));
}

}  // namespace

RankCommitter::RankCommitter(DistributedOptions options, FileSystem* fs, std::string root,
                             std::string writer)
    : options_(std::move(options)), fs_(fs), root_(std::move(root)), writer_(std::move(writer)) {}

std::string RankCommitter::SaveKey(const std::string& temp_dir, absl::string_view what) const {
  const size_t slash = temp_dir.find_last_of('/');
  const absl::string_view name =
      slash == std::string::npos ? absl::string_view(temp_dir) : absl::string_view(temp_dir).substr(slash + 1);
  return absl::StrCat(options_.key_prefix, "/", name, "/", what);
}

absl::Status RankCommitter::Handshake() {
  const std::string key = absl::StrCat(options_.key_prefix, "/nonce");
  if (rank() == 0) {
    absl::BitGen gen;
    const std::string nonce = absl::StrFormat("%016x", absl::Uniform<uint64_t>(gen));
    // The owner line of the writer lock rank 0 holds: every other rank reads
    // it in ROOT, which proves they all see one ROOT (`SeesRankZerosRoot`).
    CKPT_ASSIGN_OR_RETURN(std::string lock_line, ReadSmallFile(*fs_, WriterLockPath(root_), kLockLineMax));
    const std::string value = Json{{"nonce", nonce},
                                   {"world_size", world_size()},
                                   {"shared_root", options_.shared_root},
                                   {"root_lock", lock_line}}
                                  .dump();
    CKPT_ASSIGN_OR_RETURN(std::string held, options_.store->SetIfAbsent(key, value));
    if (held != value) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the coordination store already holds the keys of an engine opened with key_prefix \"",
          options_.key_prefix, "\": every opening of a root needs its own prefix"));
    }
    nonce_ = nonce;
    return absl::OkStatus();
  }
  auto value = options_.store->Get(key, options_.commit_timeout);
  if (!value.ok()) {
    if (absl::IsDeadlineExceeded(value.status())) {
      return absl::DeadlineExceededError(absl::StrCat(
          "rank ", rank(), ": rank 0 did not open its engine on ", root_, " within ",
          Seconds(options_.commit_timeout), " (commit_timeout; key_prefix \"", options_.key_prefix,
          "\")"));
    }
    return LostStore(rank(), "rank 0 to open its engine", value.status());
  }
  Json j = Json::parse(*value, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("nonce") || !j["nonce"].is_string() ||
      !j.contains("world_size") || !j["world_size"].is_number_integer()) {
    return absl::InternalError(absl::StrCat("unreadable handshake in the coordination store: ", *value));
  }
  if (j["world_size"].get<int>() != world_size()) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank(), " opened ", root_, " with world_size ",
                                                   world_size(), ", rank 0 with ",
                                                   j["world_size"].get<int>()));
  }
  const bool shared_root = j.contains("shared_root") && j["shared_root"].is_boolean()
                               ? j["shared_root"].get<bool>()
                               : true;
  if (shared_root != options_.shared_root) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank(), " opened ", root_, " with shared_root ", options_.shared_root ? "true" : "false",
        ", rank 0 with ", shared_root ? "true" : "false", ": every rank must say the same"));
  }
  nonce_ = j["nonce"].get<std::string>();
  if (options_.shared_root && j.contains("root_lock") && j["root_lock"].is_string()) {
    CKPT_RETURN_IF_ERROR(SeesRankZerosRoot(j["root_lock"].get<std::string>()));
  }
  return absl::OkStatus();
}

absl::Status RankCommitter::SeesRankZerosRoot(const std::string& lock_line) {
  const std::string path = WriterLockPath(root_);
  absl::StatusOr<std::string> seen;
  for (const absl::Time until = absl::Now() + kSharedRootPatience;;) {
    seen = ReadSmallFile(*fs_, path, kLockLineMax);
    if ((seen.ok() && *seen == lock_line) || absl::Now() >= until) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  if (seen.ok() && *seen == lock_line) return absl::OkStatus();
  const std::string here =
      seen.ok() ? absl::StrCat("holds \"", absl::StripTrailingAsciiWhitespace(*seen), "\"")
                : absl::StrCat("cannot be read (", seen.status().message(), ")");
  return absl::FailedPreconditionError(absl::StrCat(
      "rank ", rank(), " (host ", ThisHost(), ") does not see rank 0's checkpoint root ", root_,
      ": rank 0 holds its writer lock as \"", absl::StripTrailingAsciiWhitespace(lock_line),
      "\", but here ", path, " ", here,
      ". ROOT must be one directory on a file system every rank shares (NFS, Lustre, GPFS, a "
      "cloud file store), the same path on every rank. Ranks on machines that share no file "
      "system write one checkpoint only into a bucket: open each rank on a directory of its own "
      "with shared_root = false and publish every step (Python: Checkpointer(ROOT, "
      "tier=\"s3://...\", shared_root=False); docs/distributed.md)"));
}

void RankCommitter::AnnounceStep(int64_t step) {
  times_ = Times{};
  (void)options_.store->Set(absl::StrCat(options_.key_prefix, "/current/", rank()),
                            absl::StrCat(step));
}

absl::StatusOr<std::string> RankCommitter::WaitFor(const std::string& key, absl::Time deadline,
                                                   const InterruptFn& interrupt) {
  while (true) {
    const absl::Duration left = std::max(kPeek, deadline - absl::Now());
    auto value = options_.store->Get(key, std::min(left, kWaitSlice));
    if (value.ok() || !absl::IsDeadlineExceeded(value.status())) return value;
    if (interrupt) {
      absl::Status interrupted = interrupt();
      if (!interrupted.ok()) return interrupted;
    }
    if (absl::Now() >= deadline) return value;
  }
}

absl::Status RankCommitter::DecideAbort(const std::string& temp_dir, const absl::Status& reason) {
  auto held = options_.store->SetIfAbsent(SaveKey(temp_dir, "decision"),
                                          EncodeStoreValue(StoreValue::Abort(reason)));
  if (!held.ok()) return reason;  // nobody can commit without the store either
  absl::StatusOr<StoreValue> decided = DecodeStoreValue(*held, "decision");
  if (!decided.ok()) return decided.status();
  if (decided->verdict == Verdict::kAbort) return decided->status;
  // Only rank 0 decides to commit, and it does not abort afterwards.
  return absl::InternalError(absl::StrCat("rank ", rank(), " could not abort a save rank 0 commits"));
}

absl::Status RankCommitter::CommitPart(int64_t step, const std::string& temp_dir,
                                       const std::string& final_name, const Part& part,
                                       const std::string& extras_json,
                                       const CancelledFn& cancelled) {
  Json report = {{"ok", true},
                 {"step", step},
                 {"world_size", world_size()},
                 {"manifest", part.manifest},
                 {"manifest_xxh3", HashToHex(part.manifest_xxh3)},
                 {"kind", std::string(CheckpointKindName(part.kind))},
                 {"base_step", part.base_step},
                 {"replicated", HashToHex(part.replicated_fingerprint)}};
  if (!options_.shared_root) report["manifest_json"] = part.contents;
  absl::Status reported = options_.store->Set(SaveKey(temp_dir, absl::StrCat("report/", rank())),
                                              report.dump());
  reported_ = temp_dir;
  times_ = Times{};
  last_commit_mixed_kinds_ = false;
  if (!reported.ok()) return LostStore(rank(), "nothing (reporting its part)", reported);
  KillPoint("commit.rank_reported");
  if (rank() == 0) return CommitAsRankZero(step, temp_dir, final_name, part, extras_json, cancelled);
  return FollowRankZero(step, temp_dir, final_name, cancelled);
}

namespace {

// Every rank's part as rank 0 sees it: read from the shared temp directory
// (which also checks that ROOT is one file system for all ranks), or, when
// the ranks share no ROOT, parsed from the manifest each rank reported.
// Checks it is the manifest its rank reported (`reported`, by rank), and
// fills in the parts of `*out_global`. Not OK: the reason to abort.
absl::Status LoadParts(FileSystem& fs, int64_t step, const std::string& temp_dir, bool shared_root,
                       const std::vector<RankCommitter::Reported>& reported, GlobalManifest* out_global,
                       std::vector<Manifest>* out_parts) {
  GlobalManifest& global = *out_global;
  std::vector<Manifest>& parts = *out_parts;
  parts.reserve(reported.size());
  for (int r = 0; r < static_cast<int>(reported.size()); ++r) {
    const std::string name = RankManifestName(r);
    absl::StatusOr<Manifest> m;
    if (shared_root) {
      m = LoadManifest(fs, temp_dir, step, name);
      if (!m.ok()) {
        return absl::DataLossError(absl::StrCat("rank ", r, "'s part of step ", step,
                                                " is not readable on rank 0 (", m.status().message(),
                                                "): ROOT must be on a file system every rank shares"));
      }
    } else {
      m = ParseManifest(reported[r].contents, absl::StrCat("rank ", r, "'s report of ", name));
      if (!m.ok()) return Annotate(m.status(), absl::StrCat("step ", step));
      if (m->step != step) {
        return absl::InvalidArgumentError(
            absl::StrCat("rank ", r, " reported a part of step ", m->step, " for step ", step));
      }
    }
    if (m->manifest_xxh3 != reported[r].manifest_xxh3) {
      return absl::DataLossError(
          absl::StrCat("rank ", r, "'s manifest of step ", step,
                       shared_root ? " on disk is not the one it reported"
                                   : " in its report does not have the checksum it reported"));
    }
    RankPart p;
    p.rank = r;
    p.manifest = name;
    p.manifest_xxh3 = m->manifest_xxh3;
    p.kind = m->kind;
    p.base_step = m->base_step;
    p.tensor_bytes = m->tensor_bytes();
    p.file_bytes = m->shard_bytes();
    p.tensor_count = m->tensors.size();
    p.shard_count = m->shards.size();
    if (m->kind == CheckpointKind::kDelta) {
      global.kind = CheckpointKind::kDelta;
      global.base_step = m->base_step;
      global.delta_mode = m->delta_mode;
    }
    global.ranks.push_back(std::move(p));
    parts.push_back(std::move(*m));
  }
  return absl::OkStatus();
}

// Whether the ranks' parts of `step` make one checkpoint: deltas of one
// base, a name two ranks saved is one tensor (unless both declared it
// rank-local), the chunks of each sharded tensor tile it. Not OK: why not.
absl::Status CheckAgreement(int64_t step, const std::vector<Manifest>& parts) {
  std::set<int64_t> bases;
  for (const Manifest& m : parts) {
    if (m.kind == CheckpointKind::kDelta) bases.insert(m.base_step);
  }
  if (bases.size() > 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("the ranks' parts of step ", step, " are deltas of different steps (",
                     absl::StrJoin(bases, ", "), "): the next save is full"));
  }
  // A name two ranks both saved must be the same tensor, unless every rank
  // that saved it declared it rank-local.
  std::map<absl::string_view, std::pair<int, const TensorInfo*>> seen;
  for (int r = 0; r < static_cast<int>(parts.size()); ++r) {
    for (const TensorInfo& t : parts[r].tensors) {
      if (t.placement == TensorPlacement::kSharded) continue;  // checked below
      auto [it, inserted] = seen.emplace(t.name, std::pair{r, &t});
      if (inserted) continue;
      const TensorInfo& first = *it->second.second;
      if (first.placement == TensorPlacement::kRankLocal && t.placement == TensorPlacement::kRankLocal)
        continue;
      if (first.dtype == t.dtype && first.shape == t.shape && first.xxh3 == t.xxh3) continue;
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", t.name, "\" of step ", step, " differs between rank ", it->second.first,
                       " and rank ", r,
                       ": declare it rank-local if each rank holds its own value, or "
                       "replicated if they are meant to be equal"));
    }
  }
  // The chunks of each sharded tensor tile it.
  std::vector<RankRecords> records;
  for (int r = 0; r < static_cast<int>(parts.size()); ++r)
    records.push_back(RankRecords{r, &parts[r].tensors});
  absl::StatusOr<std::vector<GlobalTensor>> globals = GatherGlobalTensors(records);
  if (!globals.ok()) return Annotate(globals.status(), absl::StrCat("step ", step));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<RankCommitter::Reported>> RankCommitter::CollectReports(int64_t step, const std::string& temp_dir,
                                                                    const Part& part,
                                                                    const CancelledFn& cancelled) {
  const absl::Time deadline = absl::Now() + options_.commit_timeout;
  const std::string decision_key = SaveKey(temp_dir, "decision");
  // Every other rank's report, in rank order; a rank that fails (or gives
  // up) may decide to abort meanwhile, which ends the wait at once.
  std::vector<Reported> reported(world_size());
  reported[0] = Reported{part.manifest_xxh3, part.contents};
  std::vector<int> missing;
  absl::Status interruption;
  const InterruptFn interrupt = [&]() {
    if (options_.store->Get(decision_key, kPeek).ok()) {
      interruption = absl::AbortedError("aborted by another rank");  // (the decision stands)
    } else if (absl::Status why = cancelled ? cancelled() : absl::OkStatus(); !why.ok()) {
      interruption = absl::Status(why.code(), absl::StrCat("rank 0 gave up step ", step,
                                                           " while it waited "
                                                           "for the other ranks: ",
                                                           why.message()));
    }
    return interruption;
  };
  for (int r = 1; r < world_size(); ++r) {
    // Once a rank is missing, the rest are only looked at.
    absl::StatusOr<std::string> value = WaitFor(SaveKey(temp_dir, absl::StrCat("report/", r)),
                                                missing.empty() ? deadline : absl::Now(), interrupt);
    if (!interruption.ok()) return interruption;
    if (!value.ok()) {
      if (absl::IsDeadlineExceeded(value.status())) {
        missing.push_back(r);
        continue;
      }
      return LostStore(0, absl::StrCat("rank ", r, "'s report"), value.status());
    }
    Json j = Json::parse(*value, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("ok") || !j["ok"].is_boolean()) {
      return absl::InternalError(absl::StrCat("rank ", r, " sent an unreadable report"));
    }
    if (!j["ok"].get<bool>()) {
      const std::string why = j.value("error", std::string("unknown error"));
      const int code = j.value("code", static_cast<int>(absl::StatusCode::kInternal));
      return absl::Status(static_cast<absl::StatusCode>(code), absl::StrCat("rank ", r, " failed: ", why));
    }
    if (j.value("world_size", 0) != world_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", r, " saves with world_size ", j.value("world_size", 0), ", rank 0 with ", world_size()));
    }
    if (j.value("replicated", std::string()) != HashToHex(part.replicated_fingerprint)) {
      return absl::InvalidArgumentError(
          absl::StrCat("ranks 0 and ", r, " declare different replicated tensors in step ", step,
                       " (every rank must declare the same names, dtypes and shapes)"));
    }
    reported[r].manifest_xxh3 = HashFromHex(j.value("manifest_xxh3", std::string())).value_or(0);
    if (!options_.shared_root) {
      if (!j.contains("manifest_json") || !j["manifest_json"].is_string()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "rank ", r, "'s report of step ", step, " holds no manifest (does it share ROOT with rank 0?)"));
      }
      reported[r].contents = j["manifest_json"].get<std::string>();
    }
  }
  if (!missing.empty()) {
    std::vector<std::string> who;
    for (int r : missing) {
      std::string w = absl::StrCat(r);
      auto current = options_.store->Get(absl::StrCat(options_.key_prefix, "/current/", r), kPeek);
      if (current.ok() && *current != absl::StrCat(step))
        absl::StrAppend(&w, " (saving step ", *current, ")");
      who.push_back(std::move(w));
    }
    return absl::DeadlineExceededError(
        absl::StrCat(missing.size() == 1 ? "rank " : "ranks ", absl::StrJoin(who, ", "),
                     missing.size() == 1 ? " did" : " did", " not report its part of step ", step, " within ",
                     Seconds(options_.commit_timeout), " (commit_timeout): nothing was committed"));
  }

  return reported;
}

absl::Status RankCommitter::CommitAsRankZero(int64_t step, const std::string& temp_dir,
                                             const std::string& final_name, const Part& part,
                                             const std::string& extras_json, const CancelledFn& cancelled) {
  const absl::Time reported_at = absl::Now();
  const std::string decision_key = SaveKey(temp_dir, "decision");
  absl::StatusOr<std::vector<Reported>> reported = CollectReports(step, temp_dir, part, cancelled);
  if (!reported.ok()) return DecideAbort(temp_dir, reported.status());
  const absl::Time all_reported = absl::Now();
  times_.ranks_wait_s = absl::ToDoubleSeconds(all_reported - reported_at);
  GlobalManifest global;
  global.step = step;
  global.world_size = world_size();
  global.writer = writer_;
  global.extras_json = extras_json;
  global.created_unix_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                               std::chrono::system_clock::now().time_since_epoch())
                               .count();
  std::vector<Manifest> parts;
  absl::Status agreed = LoadParts(*fs_, step, temp_dir, options_.shared_root, *reported, &global, &parts);
  if (agreed.ok()) agreed = CheckAgreement(step, parts);
  if (!agreed.ok()) return DecideAbort(temp_dir, agreed);
  // Decide and commit.
  absl::StatusOr<std::string> contents = SerializeGlobalManifest(&global);
  if (!contents.ok()) return DecideAbort(temp_dir, Annotate(contents.status(), "rank 0"));
  absl::Status written = WriteFileDurably(*fs_, JoinPath(temp_dir, kManifestName), *contents);
  if (written.ok()) written = SyncTempDir(*fs_, temp_dir);
  if (!written.ok()) return DecideAbort(temp_dir, Annotate(written, "rank 0"));
  if (!options_.shared_root) {
    // Each rank commits a copy of its own with the same manifest.
    absl::Status sent = options_.store->Set(SaveKey(temp_dir, "manifest"), *contents);
    if (!sent.ok()) return DecideAbort(temp_dir, LostStore(0, "nothing (sending the manifest)", sent));
  }
  KillPoint("commit.manifest");
  bool any_full = false;
  bool any_delta = false;
  for (const RankPart& p : global.ranks) {
    any_full |= p.kind == CheckpointKind::kFull;
    any_delta |= p.kind == CheckpointKind::kDelta;
  }
  const std::string commit = EncodeStoreValue(StoreValue::Commit(any_full && any_delta));
  auto held = options_.store->SetIfAbsent(decision_key, commit);
  if (!held.ok()) return LostStore(0, "nothing (deciding to commit)", held.status());
  if (*held != commit) return AbortReason(*held);
  last_commit_mixed_kinds_ = any_full && any_delta;
  KillPoint("commit.decided");
  absl::Status committed = CommitCheckpoint(*fs_, root_, temp_dir, final_name);
  times_.commit_latency_s = absl::ToDoubleSeconds(absl::Now() - all_reported);
  (void)options_.store->Set(SaveKey(temp_dir, "result"),
                            EncodeStoreValue(committed.ok() ? StoreValue::Committed()
                                                            : StoreValue::CommitFailed(committed)));
  AwaitResultSeen(temp_dir);
  return committed;
}

void RankCommitter::AwaitResultSeen(const std::string& temp_dir) {
  // Rank 0's process often hosts the store (a TCPStore under
  // init_method="tcp://..."): once this save completes it may exit, and the
  // store with it. A rank that had not read the result yet would then fail a
  // save that committed. Every rank that reported waits for the result and
  // says so at once; one that does not within the patience died after its
  // report or lost the store, and the outcome stands either way.
  const absl::Time deadline = absl::Now() + std::min(options_.commit_timeout, kResultSeenPatience);
  for (int r = 1; r < world_size(); ++r) {
    if (!WaitFor(SaveKey(temp_dir, absl::StrCat("seen/", r)), deadline, nullptr).ok()) return;
  }
}

absl::Status RankCommitter::CommitOwnCopy(int64_t step, const std::string& temp_dir,
                                          const std::string& final_name) {
  auto contents = WaitFor(SaveKey(temp_dir, "manifest"), absl::Now() + kResultSeenPatience, nullptr);
  if (!contents.ok()) {
    return Annotate(contents.status(), absl::StrCat("rank ", rank(), ": the manifest of step ", step,
                                                    " rank 0 decided to commit"));
  }
  CKPT_RETURN_IF_ERROR(WriteFileDurably(*fs_, JoinPath(temp_dir, kManifestName), *contents));
  CKPT_RETURN_IF_ERROR(SyncTempDir(*fs_, temp_dir));
  // The manifest must list this rank's part as it is here.
  absl::StatusOr<Manifest> own = LoadRankPart(*fs_, temp_dir, step, rank());
  if (!own.ok()) {
    return Annotate(own.status(), absl::StrCat("rank ", rank(), ": step ", step, "'s manifest from rank 0"));
  }
  return CommitCheckpoint(*fs_, root_, temp_dir, final_name);
}

absl::Status RankCommitter::FollowRankZero(int64_t step, const std::string& temp_dir,
                                           const std::string& final_name, const CancelledFn& cancelled) {
  const std::string decision_key = SaveKey(temp_dir, "decision");
  // A little longer than rank 0 waits for the reports, so that when a rank
  // is missing, rank 0's verdict (naming it) is the one that stands.
  const absl::Duration patience =
      options_.commit_timeout + options_.commit_timeout / 10 + absl::Seconds(1);
  const absl::Time reported = absl::Now();
  absl::Status interruption;
  auto decision = WaitFor(decision_key, reported + patience, [&]() {
    if (cancelled) interruption = cancelled();
    return interruption;
  });
  times_.ranks_wait_s = absl::ToDoubleSeconds(absl::Now() - reported);
  if (!decision.ok()) {
    if (interruption.ok() && !absl::IsDeadlineExceeded(decision.status())) {
      return LostStore(rank(), "rank 0's decision", decision.status());
    }
    const absl::Status reason =
        !interruption.ok()
            ? absl::Status(interruption.code(),
                           absl::StrCat("rank ", rank(), " gave the save up while it waited for rank 0's "
                                        "decision: ", interruption.message()))
            : absl::DeadlineExceededError(absl::StrCat(
                  "rank ", rank(), " had no decision from rank 0 within ", Seconds(patience),
                  " (rank 0 is slower than commit_timeout allows, hung, or dead): nothing was committed"));
    decision = options_.store->SetIfAbsent(decision_key, EncodeStoreValue(StoreValue::Abort(reason)));
    if (!decision.ok()) return LostStore(rank(), "rank 0's decision", decision.status());
  }
  CKPT_ASSIGN_OR_RETURN(const StoreValue decided, DecodeStoreValue(*decision, "decision"));
  if (!decided.is_commit()) return AbortReason(*decision);
  last_commit_mixed_kinds_ = decided.verdict == Verdict::kCommitMixedKinds;
  // Rank 0 decided to commit: the rest is its renames and fsyncs (and, when
  // the ranks share no ROOT, then this rank's own, so that a rank's copy of
  // a step exists only where rank 0 committed it).
  auto result = WaitFor(SaveKey(temp_dir, "result"), absl::Now() + patience, nullptr);
  if (!result.ok()) {
    if (absl::IsDeadlineExceeded(result.status())) {
      return absl::DeadlineExceededError(absl::StrCat(
          "rank 0 decided to commit but did not report the outcome within ", Seconds(patience),
          ": the checkpoint may or may not be in place (readers verify it)"));
    }
    return LostStore(rank(), "the outcome of rank 0's commit", result.status());
  }
  times_.commit_latency_s = absl::ToDoubleSeconds(absl::Now() - reported);
  (void)options_.store->Set(SaveKey(temp_dir, absl::StrCat("seen/", rank())), "1");
  CKPT_ASSIGN_OR_RETURN(const StoreValue outcome, DecodeStoreValue(*result, "result"));
  if (outcome.verdict == Verdict::kCommitted) {
    if (options_.shared_root) return absl::OkStatus();
    absl::Status own = CommitOwnCopy(step, temp_dir, final_name);
    times_.commit_latency_s = absl::ToDoubleSeconds(absl::Now() - reported);
    return own;
  }
  if (outcome.verdict != Verdict::kCommitFailed) {
    return absl::InternalError(absl::StrCat("unexpected result in the coordination store: ", *result));
  }
  const absl::Status& error = outcome.status;
  return absl::Status(error.code(), absl::StrCat("rank 0 could not commit: ", error.message()));
}

absl::Status RankCommitter::AbandonPart(const std::string& temp_dir, const absl::Status& error) {
  // After its report, a rank's error is the save's outcome already.
  if (reported_ == temp_dir) return error;
  reported_ = temp_dir;
  Json report = {{"ok", false},
                 {"code", static_cast<int>(error.code())},
                 {"error", std::string(error.message())}};
  (void)options_.store->Set(SaveKey(temp_dir, absl::StrCat("report/", rank())), report.dump());
  const absl::Status own(error.code(), absl::StrCat("rank ", rank(), " failed: ", error.message()));
  auto held = options_.store->SetIfAbsent(SaveKey(temp_dir, "decision"),
                                          EncodeStoreValue(StoreValue::Abort(own)));
  if (!held.ok()) return error;
  absl::StatusOr<StoreValue> held_value = DecodeStoreValue(*held, "decision");
  if (held_value.ok() && held_value->is_commit()) return error;
  const absl::Status decided = held_value.ok() ? held_value->status : held_value.status();
  if (decided.message() == own.message()) return error;  // this rank's own failure decided it
  return absl::Status(decided.code(), absl::StrCat(decided.message(), " (rank ", rank(),
                                                   "'s own part failed too: ", error.message(), ")"));
}

void RankCommitter::RemoveOwnFiles(const std::string& temp_dir) {
  if (rank() == 0 || !options_.shared_root) {
    RemoveTreeBestEffort(*fs_, temp_dir);
    return;
  }
  auto names = fs_->ListDir(temp_dir);
  if (!names.ok()) return;
  const std::string prefix = RankFilePrefix(rank());
  for (const std::string& name : *names) {
    if (absl::StartsWith(name, prefix)) (void)fs_->RemoveFile(JoinPath(temp_dir, name));
  }
}

}  // namespace ckpt::internal
