// Reclaiming the orphans of a checkpoint root: what dead writers, compactions,
// copies and removals left behind. See `ReclaimOrphans` in ckpt/maintenance.h.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "ckpt/compact.h"
#include "ckpt/maintenance.h"
#include "format/names.h"
#include "util/log.h"
#include "util/status_macros.h"

namespace ckpt {
namespace {

using internal::JoinPath;
using internal::Log;
using internal::LogLevel;

// Whether `kind` is in `scope` (compaction set-asides are finished, not
// removed, and are not listed here).
bool InScope(RootEntryKind kind, const ReclaimScope& scope) {
  switch (kind) {
    case RootEntryKind::kSaveTemp:
      return scope.save_temps;
    case RootEntryKind::kCompactTemp:
    case RootEntryKind::kCopyTemp:
    case RootEntryKind::kOtherTemp:
    case RootEntryKind::kTrash:
    case RootEntryKind::kDirectProbe:
      return scope.job_debris;
    default:
      return false;
  }
}

// What left an orphan of `kind` behind, for the log line.
absl::string_view LeftBy(RootEntryKind kind) {
  switch (kind) {
    case RootEntryKind::kSaveTemp: return "a save its writer did not finish";
    case RootEntryKind::kCompactTemp: return "a compaction that did not finish";
    case RootEntryKind::kCopyTemp: return "a copy into this root that did not finish";
    case RootEntryKind::kOtherTemp: return "a temp directory no job owns";
    case RootEntryKind::kTrash: return "a removal that did not finish";
    case RootEntryKind::kDirectProbe: return "an O_DIRECT probe its engine did not remove";
    default: return "an orphan";
  }
}

// Whether the probe file `path` is younger than `min_age` (an engine may be
// probing with it right now). Unknown age counts as young.
bool YoungProbe(FileSystem& fs, const std::string& path, absl::Duration min_age, absl::Time now) {
  if (min_age <= absl::ZeroDuration()) return false;
  absl::StatusOr<FileStat> stat = fs.Stat(path);
  if (!stat.ok()) return true;
  return now - absl::FromUnixNanos(stat->mtime_ns) < min_age;
}

// Hands ROOT's `.compact-old-*` entries, if any, to
// `FinishInterruptedCompactions`; a failure is only logged.
void FinishCompactions(const std::shared_ptr<FileSystem>& fs, const std::string& root,
                       const std::vector<std::string>& names, ReclaimStats& stats) {
  size_t asides = 0;
  for (const std::string& name : names) {
    if (ClassifyRootEntry(name) == RootEntryKind::kCompactAside) ++asides;
  }
  if (asides == 0) return;
  absl::Status s = FinishInterruptedCompactions(root, fs);
  if (s.ok()) {
    stats.compactions_finished += asides;
  } else {
    ++stats.failed;
    Log(LogLevel::kWarning, absl::StrCat("could not finish the interrupted compactions in ", root,
                                         " (readers ignore what is left; the next open or "
                                         "ckpt-retain retries): ", s.message()));
  }
}

}  // namespace

absl::StatusOr<uint64_t> TreeBytes(FileSystem& fs, const std::string& path) {
  CKPT_ASSIGN_OR_RETURN(const FileStat stat, fs.Stat(path));
  if (stat.is_symlink) return 0;
  if (!stat.is_directory) return stat.size;
  CKPT_ASSIGN_OR_RETURN(std::vector<std::string> names, fs.ListDir(path));
  uint64_t total = 0;
  for (const std::string& name : names) {
    absl::StatusOr<uint64_t> bytes = TreeBytes(fs, JoinPath(path, name));
    if (!bytes.ok() && !absl::IsNotFound(bytes.status())) return bytes.status();
    if (bytes.ok()) total += *bytes;  // gone meanwhile counts 0
  }
  return total;
}

std::string HumanBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  double value = static_cast<double>(bytes) / 1024;
  size_t unit = 0;
  while (value >= 1024 && unit + 1 < std::size(kUnits)) {
    value /= 1024;
    ++unit;
  }
  return absl::StrFormat("%.1f %s", value, kUnits[unit]);
}

std::vector<std::string> ReclaimStats::removed_names() const {
  std::vector<std::string> names;
  for (const ReclaimedEntry& e : entries) {
    if (e.status.ok()) names.push_back(e.name);
  }
  return names;
}

absl::StatusOr<ReclaimStats> ReclaimOrphans(const std::string& root, const ReclaimScope& scope,
                                            std::shared_ptr<FileSystem> fs) {
  if (fs == nullptr) fs = PosixFileSystem();
  ReclaimStats stats;
  CKPT_ASSIGN_OR_RETURN(std::vector<std::string> names, fs->ListDir(root));
  if (scope.job_debris && !scope.dry_run) {
    // First, as it may leave trash of its own for the sweep below.
    FinishCompactions(fs, root, names, stats);
    if (stats.compactions_finished > 0) {
      CKPT_ASSIGN_OR_RETURN(names, fs->ListDir(root));
    }
  }
  std::sort(names.begin(), names.end());
  const absl::Time now = absl::Now();
  for (const std::string& name : names) {
    const RootEntryKind kind = ClassifyRootEntry(name);
    if (!InScope(kind, scope)) continue;
    const std::string path = JoinPath(root, name);
    if (kind == RootEntryKind::kDirectProbe && YoungProbe(*fs, path, scope.probe_min_age, now)) {
      continue;
    }
    ReclaimedEntry entry{name, kind, 0, absl::OkStatus()};
    absl::StatusOr<uint64_t> bytes = TreeBytes(*fs, path);
    if (bytes.ok()) {
      entry.bytes = *bytes;
    } else if (absl::IsNotFound(bytes.status())) {
      continue;  // gone meanwhile
    }  // else: unknown size; the removal will say what is wrong
    if (!scope.dry_run) {
      entry.status = RemoveTree(*fs, path);
      if (absl::IsNotFound(entry.status) && !fs->Stat(path).ok()) entry.status = absl::OkStatus();
    }
    if (entry.status.ok()) {
      ++stats.removed;
      stats.bytes += entry.bytes;
      if (!scope.dry_run) {
        Log(LogLevel::kInfo, absl::StrCat("removed ", path, " (", HumanBytes(entry.bytes), "), ",
                                          LeftBy(kind)));
      }
    } else {
      ++stats.failed;
      Log(LogLevel::kWarning,
          absl::StrCat("could not remove ", path, " (", HumanBytes(entry.bytes), "), ", LeftBy(kind),
                       ": ", entry.status.message(), "; readers ignore it, it is retried later"));
    }
    stats.entries.push_back(std::move(entry));
  }
  return stats;
}

absl::StatusOr<std::vector<TrashedSaveTemp>> TrashSaveTemps(const std::string& root,
                                                            std::shared_ptr<FileSystem> fs) {
  if (fs == nullptr) fs = PosixFileSystem();
  CKPT_ASSIGN_OR_RETURN(std::vector<std::string> names, fs->ListDir(root));
  std::sort(names.begin(), names.end());
  std::vector<TrashedSaveTemp> trashed;
  for (const std::string& name : names) {
    if (ClassifyRootEntry(name) != RootEntryKind::kSaveTemp) continue;
    // ".tmp-step-S-<nonce>" -> ".trash-step-S-<nonce>-<hex>".
    const absl::string_view bare = absl::string_view(name).substr(internal::kTempPrefix.size());
    TrashedSaveTemp t{name, internal::UniqueName(internal::kTrashPrefix, bare)};
    absl::Status s = fs->Rename(JoinPath(root, name), JoinPath(root, t.trash), RenameMode::kNoReplace);
    if (!s.ok()) {
      if (!absl::IsNotFound(s)) {
        Log(LogLevel::kWarning, absl::StrCat("could not move ", JoinPath(root, name),
                                             " out of the way: ", s.message()));
      }
      continue;
    }
    trashed.push_back(std::move(t));
  }
  if (!trashed.empty()) CKPT_RETURN_IF_ERROR(fs->SyncDir(root));
  return trashed;
}

}  // namespace ckpt
