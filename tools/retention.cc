#include "retention.h"

#include <fcntl.h>
#include <sys/file.h>
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
  if (fs::exists(final_dir)) return absl::AlreadyExistsError(final_dir + " already exists");
  const std::string temp = absl::StrCat(cold, "/.tmp-", name, "-", Nonce());
  std::error_code ec;
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

}  // namespace

const char* ActionName(RetentionAction::Kind kind) {
  switch (kind) {
    case RetentionAction::Kind::kKeep: return "keep";
    case RetentionAction::Kind::kMove: return "move";
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
      return absl::NotFoundError(absl::StrCat("--cold_dir ", policy.cold_dir, " is not a directory"));
    }
    const fs::path r = fs::canonical(root), c = fs::canonical(policy.cold_dir);
    auto [ri, ci] = std::mismatch(r.begin(), r.end(), c.begin(), c.end());
    if (r == c || ri == r.end() || ci == c.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--cold_dir ", policy.cold_dir, " must be a different directory, not inside or around ", root));
    }
  }
  // One job at a time per root.
  const std::string lock_path = root + "/.ckpt-retain.lock";
  int lock = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock < 0) return Errno("open " + lock_path);
  if (::flock(lock, LOCK_EX | LOCK_NB) != 0) {
    ::close(lock);
    return absl::UnavailableError(absl::StrCat("another ckpt-retain holds ", lock_path));
  }
  struct Unlock { int fd; ~Unlock() { ::flock(fd, LOCK_UN); ::close(fd); } } unlock{lock};

  auto listed = ListCheckpoints(root);
  if (!listed.ok()) return listed.status();
  auto names = fs::directory_iterator(root, ec);
  if (ec) return absl::InternalError(absl::StrCat("list ", root, ": ", ec.message()));
  bool looks_like_root = fs::exists(root + "/LATEST") || !listed->empty();
  if (!looks_like_root) {
    return absl::FailedPreconditionError(absl::StrCat(root, " holds no checkpoints and no LATEST: not a checkpoint root"));
  }

  std::map<int64_t, const CheckpointSummary*> by_step;
  for (const CheckpointSummary& s : *listed) by_step[s.step] = &s;
  std::map<int64_t, std::string> keep;  // step -> reason
  auto hint = ReadLatestHint(root);
  if (!by_step.empty()) keep[by_step.rbegin()->first] = "newest";
  if (hint.ok() && hint->has_value()) keep.emplace(**hint, "named by LATEST");
  int counted = 0;
  const absl::Time now = absl::Now();
  for (auto it = by_step.rbegin(); it != by_step.rend(); ++it) {
    const int64_t step = it->first;
    if (counted++ < policy.keep_last) keep.emplace(step, absl::StrCat("among the last ", policy.keep_last));
    if (policy.keep_every > 0 && step % policy.keep_every == 0) {
      keep.emplace(step, absl::StrCat("every ", policy.keep_every, "th step"));
    }
    if (policy.keep_newer_than > absl::ZeroDuration() && it->second->manifest_status.ok() &&
        now - absl::FromUnixNanos(it->second->created_unix_ns) < policy.keep_newer_than) {
      keep.emplace(step, "newer than " + absl::FormatDuration(policy.keep_newer_than));
    }
  }
  // Chains: every kept delta keeps its bases.
  std::vector<int64_t> work;
  for (const auto& [step, reason] : keep) work.push_back(step);
  while (!work.empty()) {
    const int64_t step = work.back();
    work.pop_back();
    auto it = by_step.find(step);
    if (it == by_step.end() || it->second->kind != "delta") continue;
    const int64_t base = it->second->base_step;
    if (keep.emplace(base, absl::StrCat("base of kept delta ", step)).second) work.push_back(base);
  }

  std::vector<RetentionAction> actions;
  for (const auto& [step, summary] : by_step) {
    const std::string name = StepDirName(step);
    if (auto k = keep.find(step); k != keep.end()) {
      actions.push_back({RetentionAction::Kind::kKeep, name, step, k->second, true, ""});
    } else if (!summary->manifest_status.ok()) {
      actions.push_back({RetentionAction::Kind::kSkipDamaged, name, step,
                         std::string(summary->manifest_status.message()), false, ""});
    } else {
      actions.push_back({policy.cold_dir.empty() ? RetentionAction::Kind::kDelete
                                                 : RetentionAction::Kind::kMove,
                         name, step, "no rule keeps it", false, ""});
    }
  }
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
    if (age >= policy.stale_temp_age) {
      actions.push_back({RetentionAction::Kind::kRemoveStale, name, -1,
                         absl::StrCat("untouched for ", absl::FormatDuration(absl::Trunc(age, absl::Seconds(1)))),
                         false, ""});
    }
  }
  if (policy.dry_run) return actions;
  // Oldest first, so a base leaves the hot tier before its dependants.
  for (RetentionAction& a : actions) {
    absl::Status s;
    switch (a.kind) {
      case RetentionAction::Kind::kMove:
        s = CopyToCold(root, a.name, policy.cold_dir);
        if (s.ok()) s = RemoveCheckpointDir(root, a.name);
        break;
      case RetentionAction::Kind::kDelete:
        s = RemoveCheckpointDir(root, a.name);
        break;
      case RetentionAction::Kind::kRemoveStale:
        fs::remove_all(root + "/" + a.name, ec);
        if (ec) s = absl::InternalError(ec.message());
        break;
      default:
        continue;
    }
    a.done = s.ok();
    if (!s.ok()) a.error = std::string(s.message());
  }
  return actions;
}

}  // namespace ckpt::tools
