#include "testing/fault_injection_log.h"

#include <span>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace ckpt::testing::fault_internal {
namespace {

inline constexpr uint64_t kMaxSavedBytes = uint64_t{1} << 20;

// Collapses repeated '/' and drops a trailing one, so that the same entry
// always has the same spelling.
std::string Normalize(absl::string_view path) {
  std::string out;
  out.reserve(path.size());
  for (char c : path) {
    if (c == '/' && !out.empty() && out.back() == '/') continue;
    out.push_back(c);
  }
  if (out.size() > 1 && out.back() == '/') out.pop_back();
  return out;
}

std::string Parent(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

bool IsUnder(absl::string_view path, absl::string_view prefix) {
  return absl::StartsWith(path, prefix) &&
         (path.size() == prefix.size() || path[prefix.size()] == '/');
}

// Moves `path` along with a rename of `from` to `to`.
void Rekey(std::string& path, absl::string_view from, absl::string_view to) {
  if (IsUnder(path, from)) path = absl::StrCat(to, path.substr(from.size()));
}

// Paths of entries that a rename replaced start with this byte: no real path
// does.
inline constexpr char kShadowMark = '\x01';
bool IsShadow(absl::string_view path) { return !path.empty() && path[0] == kShadowMark; }

}  // namespace

Replaced SaveReplaced(FileSystem& base, const std::string& path) {
  Replaced replaced;
  absl::StatusOr<FileStat> stat = base.Stat(path);
  if (!stat.ok()) return replaced;
  if (stat->is_directory) {
    replaced.kind = Replaced::Kind::kDir;
    return replaced;
  }
  replaced.kind = Replaced::Kind::kLost;
  if (stat->size > kMaxSavedBytes) return replaced;
  absl::StatusOr<std::unique_ptr<File>> file = base.Open(path, OpenOptions{});
  if (!file.ok()) return replaced;
  std::string bytes(stat->size, '\0');
  absl::StatusOr<size_t> read = (*file)->ReadAt(0, std::span<char>(bytes));
  if (!read.ok() || *read != bytes.size()) return replaced;
  replaced.kind = Replaced::Kind::kFile;
  replaced.bytes = std::move(bytes);
  return replaced;
}

std::shared_ptr<TrackedFile> DurabilityLog::FileOpened(const std::string& path, bool created,
                                                       bool truncated, uint64_t size) {
  std::string p = Normalize(path);
  if (created) AddEntry(Entry::Kind::kCreate, p, "", Replaced{});
  for (const auto& file : files_) {
    if (file->path != p) continue;
    if (created || truncated) file->synced_size = 0;
    return file;
  }
  files_.push_back(std::make_shared<TrackedFile>(TrackedFile{p, size}));
  return files_.back();
}

void DurabilityLog::Created(const std::string& path) {
  AddEntry(Entry::Kind::kCreate, Normalize(path), "", Replaced{});
}

void DurabilityLog::Removed(const std::string& path) {
  std::string p = Normalize(path);
  std::erase_if(entries_, [&](const Entry& e) { return IsUnder(e.path, p); });
  ForgetFiles(p);
}

void DurabilityLog::Renamed(const std::string& from, const std::string& to, Replaced replaced) {
  std::string f = Normalize(from), t = Normalize(to);
  std::string shadow = absl::StrCat(std::string(1, kShadowMark), next_id_, ":", t);
  RekeyAll(t, shadow, entries_.size());
  RekeyAll(f, t, entries_.size());
  AddEntry(Entry::Kind::kRename, t, f, std::move(replaced));
  entries_.back().shadow = std::move(shadow);
}

void DurabilityLog::Exchanged(const std::string& a, const std::string& b) {
  std::string x = Normalize(a), y = Normalize(b);
  SwapAll(x, y, entries_.size());
  AddEntry(Entry::Kind::kExchange, x, y, Replaced{});
}

void DurabilityLog::DirSynced(const std::string& path) {
  std::string d = Normalize(path);
  for (Entry& e : entries_) std::erase(e.pending, d);
  std::erase_if(entries_, [](const Entry& e) { return e.pending.empty(); });
}

absl::Status DurabilityLog::DropUnsynced() {
  absl::Status first;
  auto note = [&first](const absl::Status& s) {
    if (first.ok() && !s.ok()) first = s;
  };
  for (size_t i = entries_.size(); i-- > 0;) {
    Entry e = std::move(entries_[i]);
    entries_.resize(i);  // later rekeys touch earlier entries only
    if (IsShadow(e.path) || !base_->Stat(e.path).ok()) continue;
    if (e.kind == Entry::Kind::kExchange) {
      if (IsShadow(e.from) || !base_->Stat(e.from).ok()) continue;
      absl::Status status = base_->Exchange(e.path, e.from);
      note(status);
      if (status.ok()) SwapAll(e.path, e.from, entries_.size());
      continue;
    }
    if (e.kind == Entry::Kind::kCreate) {
      note(RemoveTree(e.path));
      ForgetFiles(e.path);
      continue;
    }
    if (IsShadow(e.from)) continue;  // its source was replaced durably
    absl::Status status = base_->Rename(e.path, e.from, RenameMode::kReplace);
    note(status);
    if (!status.ok()) continue;
    RekeyAll(e.path, e.from, entries_.size());
    if (e.replaced.kind == Replaced::Kind::kFile) note(WriteFile(e.path, e.replaced.bytes));
    if (e.replaced.kind == Replaced::Kind::kDir) note(base_->CreateDir(e.path));
    RekeyAll(e.shadow, e.path, entries_.size());
  }
  for (const auto& file : files_) {
    if (file->path.empty() || IsShadow(file->path)) continue;
    note(TruncateTo(file->path, file->synced_size));
  }
  files_.clear();
  entries_.clear();
  return first;
}

void DurabilityLog::AddEntry(Entry::Kind kind, std::string path, std::string from, Replaced replaced) {
  Entry e;
  e.kind = kind;
  e.path = std::move(path);
  e.from = std::move(from);
  e.replaced = std::move(replaced);
  e.pending = {Parent(e.path)};
  if (kind != Entry::Kind::kCreate && Parent(e.from) != e.pending[0]) {
    e.pending.push_back(Parent(e.from));
  }
  ++next_id_;
  entries_.push_back(std::move(e));
}

void DurabilityLog::RekeyAll(absl::string_view from, absl::string_view to, size_t end) {
  for (size_t i = 0; i < end; ++i) {
    Entry& e = entries_[i];
    Rekey(e.path, from, to);
    Rekey(e.from, from, to);
    for (std::string& dir : e.pending) Rekey(dir, from, to);
  }
  for (const auto& file : files_) Rekey(file->path, from, to);
}

void DurabilityLog::SwapAll(const std::string& a, const std::string& b, size_t end) {
  const std::string parked = absl::StrCat(std::string(1, kShadowMark), "swap:", next_id_++);
  RekeyAll(a, parked, end);
  RekeyAll(b, a, end);
  RekeyAll(parked, b, end);
}

void DurabilityLog::ForgetFiles(const std::string& path) {
  std::erase_if(files_, [&](const std::shared_ptr<TrackedFile>& file) {
    if (!IsUnder(file->path, path)) return false;
    file->path.clear();
    return true;
  });
}

absl::Status DurabilityLog::RemoveTree(const std::string& path) {
  absl::StatusOr<FileStat> stat = base_->Stat(path);
  if (!stat.ok()) return stat.status();
  if (!stat->is_directory) return base_->RemoveFile(path);
  absl::StatusOr<std::vector<std::string>> names = base_->ListDir(path);
  if (!names.ok()) return names.status();
  for (const std::string& name : *names) {
    absl::Status status = RemoveTree(absl::StrCat(path, "/", name));
    if (!status.ok()) return status;
  }
  return base_->RemoveDir(path);
}

absl::Status DurabilityLog::WriteFile(const std::string& path, const std::string& bytes) {
  OpenOptions options;
  options.write = options.create = options.truncate = true;
  absl::StatusOr<std::unique_ptr<File>> file = base_->Open(path, options);
  if (!file.ok()) return file.status();
  absl::Status status = (*file)->WriteAt(0, std::span<const char>(bytes));
  if (!status.ok()) return status;
  return (*file)->Close();
}

absl::Status DurabilityLog::TruncateTo(const std::string& path, uint64_t size) {
  absl::StatusOr<FileStat> stat = base_->Stat(path);
  if (!stat.ok() || stat->is_directory || stat->size <= size) return absl::OkStatus();
  OpenOptions options;
  options.write = true;
  absl::StatusOr<std::unique_ptr<File>> file = base_->Open(path, options);
  if (!file.ok()) return file.status();
  absl::Status status = (*file)->Truncate(size);
  if (!status.ok()) return status;
  return (*file)->Close();
}

}  // namespace ckpt::testing::fault_internal
