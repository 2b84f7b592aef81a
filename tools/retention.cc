#include "retention.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <xxhash.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "ckpt/catalog.h"
#include "ckpt/compact.h"
#include "ckpt/root_lock.h"
#include "retention_plan.h"

namespace ckpt::tools {
namespace {

namespace fs = std::filesystem;

absl::Status Errno(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

absl::Status Fsync(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) return Errno("open " + path);
  int rc = ::fsync(fd);
  ::close(fd);
  return rc == 0 ? absl::OkStatus() : Errno("fsync " + path);
}

absl::StatusOr<uint64_t> FileHash(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Errno("open " + path);
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  std::vector<char> buf(1 << 20);
  absl::Status status;
  while (true) {
    ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) { status = Errno("read " + path); break; }
    if (n == 0) break;
    XXH3_64bits_update(state, buf.data(), static_cast<size_t>(n));
  }
  ::close(fd);
  const uint64_t h = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  if (!status.ok()) return status;
  return h;
}

std::string Nonce() {
  std::random_device rd;
  return absl::StrFormat("%016x", (uint64_t{rd()} << 32) | rd());
}

// Renames `dir` out of sight, makes that durable, then deletes it.
absl::Status RemoveCheckpointDir(const std::string& root, const std::string& name) {
  const std::string trash = absl::StrCat(root, "/.trash-", name, "-", Nonce());
  if (::rename((root + "/" + name).c_str(), trash.c_str()) != 0) return Errno("rename " + name);
  if (absl::Status s = Fsync(root, true); !s.ok()) return s;
  std::error_code ec;
  fs::remove_all(trash, ec);
  if (ec) return absl::InternalError(absl::StrCat("remove ", trash, ": ", ec.message()));
  return absl::OkStatus();
}

// Copies checkpoint `name` to `cold`, durably and verified, under its own name.
absl::Status CopyToCold(const std::string& root, const std::string& name, const std::string& cold) {
  const std::string src = root + "/" + name;
  const std::string final_dir = cold + "/" + name;
  std::error_code ec;
  if (fs::exists(final_dir, ec)) return absl::AlreadyExistsError(final_dir + " already exists");
  const std::string temp = absl::StrCat(cold, "/.tmp-", name, "-", Nonce());
  fs::create_directory(temp, ec);
  if (ec) return absl::InternalError(absl::StrCat("mkdir ", temp, ": ", ec.message()));
  absl::Status status;
  for (const auto& entry : fs::directory_iterator(src)) {
    const std::string to = temp + "/" + entry.path().filename().string();
    fs::copy_file(entry.path(), to, ec);
    if (ec) { status = absl::InternalError(absl::StrCat("copy to ", to, ": ", ec.message())); break; }
    if (status = Fsync(to, false); !status.ok()) break;
    auto a = FileHash(entry.path().string());
    auto b = FileHash(to);
    if (!a.ok() || !b.ok() || *a != *b) {
      status = absl::DataLossError(absl::StrCat("copy of ", entry.path().string(), " does not verify"));
      break;
    }
  }
  if (status.ok()) status = Fsync(temp, true);
  if (status.ok() && ::rename(temp.c_str(), final_dir.c_str()) != 0) status = Errno("rename to " + final_dir);
  if (status.ok()) status = Fsync(cold, true);
  if (!status.ok()) fs::remove_all(temp, ec);
  return status;
}

// Whether `cold` already holds checkpoint `hot` complete -- a copy (the same
// manifest) or its compaction -- as an interrupted earlier run leaves it: a
// directory appears there under its final name only once complete.
absl::StatusOr<bool> AlreadyInCold(const std::string& cold, const CheckpointSummary& hot) {
  auto there = SummarizeCheckpoint(cold, hot.step);
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

// Moves checkpoint `hot` to `cold` (as it is, or with `compact` as a full
// checkpoint), then removes it from `root`.
absl::Status MoveToCold(const std::string& root, const CheckpointSummary& hot, const std::string& cold,
                        bool compact) {
  const std::string name = StepDirName(hot.step);
  auto there = AlreadyInCold(cold, hot);
  if (!there.ok()) return there.status();
  if (!*there) {
    if (compact) {
      CompactOptions options;
      options.target_root = cold;
      auto stats = CompactToFull(root, hot.step, options);
      if (!stats.ok()) return stats.status();
    } else if (absl::Status s = CopyToCold(root, name, cold); !s.ok()) {
      return s;
    }
  }
  return RemoveCheckpointDir(root, name);
}

// The stale `.tmp-`, `.trash-` and probe entries of `root`.
std::vector<RetentionAction> StaleEntries(const std::string& root, absl::Duration max_age, absl::Time now) {
  std::vector<RetentionAction> actions;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    if (!absl::StartsWith(name, ".tmp-") && !absl::StartsWith(name, ".trash-") &&
        !absl::StartsWith(name, ".ckpt-direct-probe-")) {
      continue;
    }
    // A save in progress keeps writing inside its temp dir: its age is that
    // of the most recently modified thing in it.
    struct stat st;
    if (::lstat(entry.path().c_str(), &st) != 0) continue;
    int64_t newest = st.st_mtim.tv_sec;
    if (entry.is_directory(ec)) {
      for (const auto& inner : fs::directory_iterator(entry.path(), ec)) {
        struct stat ist;
        if (::lstat(inner.path().c_str(), &ist) == 0) newest = std::max<int64_t>(newest, ist.st_mtim.tv_sec);
      }
    }
    const absl::Duration age = now - absl::FromUnixSeconds(newest);
    if (age >= max_age) {
      actions.push_back({RetentionAction::Kind::kRemoveStale, name, -1,
                         absl::StrCat("untouched for ", absl::FormatDuration(absl::Trunc(age, absl::Seconds(1)))),
                         false, ""});
    }
  }
  return actions;
}

// Carries out `plan`: compactions first (a failed one keeps the bases it
// would have freed), then what leaves ROOT, oldest first (a base that fails
// to leave stays hot, which its dependants' way out takes into account).
void Execute(const std::string& root, const RetentionPolicy& policy, RetentionPlan& plan,
             std::map<int64_t, RetentionAction>& actions) {
  using Kind = RetentionAction::Kind;
  auto& steps = plan.steps();
  for (auto& [step, planned] : steps) {
    if (planned.kind != Kind::kCompact) continue;
    RetentionAction& a = actions[step];
    auto stats = CompactToFull(root, step);
    a.done = stats.ok();
    if (stats.ok()) continue;
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
  for (auto& [step, planned] : steps) {
    if (planned.kind == Kind::kMove || planned.kind == Kind::kCompactMove) {
      planned = plan.Leave(step, stays_hot);  // a base may have failed to leave
    }
    RetentionAction& a = actions[step];
    a.kind = planned.kind;
    a.reason = planned.reason;
    const CheckpointSummary* summary = plan.Find(step);
    absl::Status s;
    switch (planned.kind) {
      case Kind::kKeep: a.done = true; continue;
      case Kind::kDelete: s = RemoveCheckpointDir(root, a.name); break;
      case Kind::kMove:
      case Kind::kCompactMove:
        s = MoveToCold(root, *summary, policy.cold_dir, planned.kind == Kind::kCompactMove);
        break;
      default: continue;
    }
    a.done = s.ok();
    if (!s.ok()) {
      a.error = std::string(s.message());
      stayed.insert(step);
    }
  }
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
  std::error_code ec;
  if (!fs::is_directory(root, ec)) {
    return absl::NotFoundError(absl::StrCat("checkpoint root ", root, " is not a directory"));
  }
  if (!policy.cold_dir.empty()) {
    if (!fs::is_directory(policy.cold_dir, ec)) {
      return absl::NotFoundError(absl::StrCat("--cold-dir ", policy.cold_dir, " is not a directory"));
    }
    const fs::path r = fs::canonical(root), c = fs::canonical(policy.cold_dir);
    auto [ri, ci] = std::mismatch(r.begin(), r.end(), c.begin(), c.end());
    if (r == c || ri == r.end() || ci == c.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--cold-dir ", policy.cold_dir, " must be a different directory, not inside or around ", root));
    }
  }
  // One job at a time per root: everything below, compactions included,
  // happens under this lock.
  auto lock = LockRoot(root, RootLockKind::kRetention, "ckpt-retain");
  if (!lock.ok()) return lock.status();  // kUnavailable: another job runs (exit code 4)

  if (!policy.dry_run) {
    // A compaction that fell back to two renames and was interrupted between
    // them: put its checkpoint back before anything is listed.
    if (absl::Status s = FinishInterruptedCompactions(root); !s.ok()) return s;
  }
  auto listed = ListCheckpoints(root);
  if (!listed.ok()) return listed.status();
  bool looks_like_root = fs::exists(root + "/LATEST", ec) || !listed->empty();
  if (!looks_like_root) {
    return absl::FailedPreconditionError(absl::StrCat(root, " holds no checkpoints and no LATEST: not a checkpoint root"));
  }
  auto hint = ReadLatestHint(root);
  const absl::Time now = absl::Now();
  RetentionPlan plan(*listed, hint.ok() ? *hint : std::nullopt, policy, now);
  std::map<int64_t, RetentionAction> actions;
  for (const auto& [step, planned] : plan.steps()) {
    actions[step] = {planned.kind, StepDirName(step), step, planned.reason,
                     planned.kind == RetentionAction::Kind::kKeep, ""};
  }
  std::vector<RetentionAction> stale = StaleEntries(root, policy.stale_temp_age, now);
  if (!policy.dry_run) {
    Execute(root, policy, plan, actions);
    for (RetentionAction& a : stale) {
      fs::remove_all(root + "/" + a.name, ec);
      a.done = !ec;
      if (ec) a.error = ec.message();
    }
  }
  std::vector<RetentionAction> result;
  for (auto& [step, a] : actions) result.push_back(std::move(a));
  for (RetentionAction& a : stale) result.push_back(std::move(a));
  return result;
}

}  // namespace ckpt::tools
