#include "testing/fault_injection_file_system.h"

#include <algorithm>
#include <cerrno>
#include <utility>

#include "absl/functional/function_ref.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "util/errno_status.h"

namespace ckpt::testing {

namespace fault_internal {

// A file opened for writing: where it is now and how much of it is durable.
struct TrackedFile {
  std::string path;  // "" once its entry is gone
  uint64_t synced_size = 0;
};

// What a kReplace rename replaced, so that undoing the rename restores it.
struct Replaced {
  enum class Kind : uint8_t { kNothing, kFile, kDir, kLost } kind = Kind::kNothing;
  std::string bytes;  // kFile: its contents
};

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

// Moves `size` bytes between `data` and `file` at offset 0 through a queue of
// `fs`, retrying short transfers and EINTR.
absl::Status Transfer(FileSystem& fs, File& file, IoOp::Kind kind, char* data, size_t size) {
  absl::StatusOr<std::unique_ptr<IoQueue>> queue = fs.NewIoQueue(IoQueueKind::kThreads, 1);
  if (!queue.ok()) return queue.status();
  size_t done = 0;
  while (done < size) {
    IoOp op{kind, &file, done, data + done, static_cast<uint32_t>(size - done), -1, 0};
    absl::Status status = (*queue)->Submit({&op, 1});
    if (!status.ok()) return status;
    std::vector<IoCompletion> completions;
    status = (*queue)->Reap(1, &completions);
    if (!status.ok()) return status;
    int64_t result = completions.empty() ? -EIO : completions[0].result;
    if (result == -EINTR || result == -EAGAIN) continue;
    if (result < 0) return ckpt::internal::ErrnoToStatus(static_cast<int>(-result), file.path());
    if (result == 0) return absl::DataLossError(absl::StrCat("unexpected end of ", file.path()));
    done += static_cast<size_t>(result);
  }
  return absl::OkStatus();
}

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
  if (!Transfer(base, **file, IoOp::Kind::kRead, bytes.data(), bytes.size()).ok()) {
    return replaced;
  }
  replaced.kind = Replaced::Kind::kFile;
  replaced.bytes = std::move(bytes);
  return replaced;
}

// `DurabilityLog` remembers what has not been made durable yet: entries
// created and renamed in directories not synced since, and the synced size of
// every file opened for writing. Paths are kept current: a rename moves every
// path under its source. Not thread-safe (the owner locks).
class DurabilityLog {
 public:
  explicit DurabilityLog(std::shared_ptr<FileSystem> base) : base_(std::move(base)) {}

  std::shared_ptr<TrackedFile> FileOpened(const std::string& path, bool created, bool truncated,
                                          uint64_t size) {
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

  void FileSynced(TrackedFile& file, uint64_t size) { file.synced_size = size; }

  // A directory, or a file not opened for writing, was created.
  void Created(const std::string& path) {
    AddEntry(Entry::Kind::kCreate, Normalize(path), "", Replaced{});
  }

  // Removal is taken as durable at once: nothing under `path` is undone.
  void Removed(const std::string& path) {
    std::string p = Normalize(path);
    std::erase_if(entries_, [&](const Entry& e) { return IsUnder(e.path, p); });
    ForgetFiles(p);
  }

  void Renamed(const std::string& from, const std::string& to, Replaced replaced) {
    std::string f = Normalize(from), t = Normalize(to);
    std::string shadow = absl::StrCat(std::string(1, kShadowMark), next_id_, ":", t);
    RekeyAll(t, shadow, entries_.size());
    RekeyAll(f, t, entries_.size());
    AddEntry(Entry::Kind::kRename, t, f, std::move(replaced));
    entries_.back().shadow = std::move(shadow);
  }

  // `a` and `b` swapped places: paths under each now live under the other.
  void Exchanged(const std::string& a, const std::string& b) {
    std::string x = Normalize(a), y = Normalize(b);
    SwapAll(x, y, entries_.size());
    AddEntry(Entry::Kind::kExchange, x, y, Replaced{});
  }

  void DirSynced(const std::string& path) {
    std::string d = Normalize(path);
    for (Entry& e : entries_) std::erase(e.pending, d);
    std::erase_if(entries_, [](const Entry& e) { return e.pending.empty(); });
  }

  absl::Status DropUnsynced() {
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

 private:
  struct Entry {
    enum class Kind : uint8_t { kCreate, kRename, kExchange } kind = Kind::kCreate;
    std::string path;                  // the created entry, the rename's target, or one exchanged
    std::string from;                  // the rename's source, or the other one exchanged
    std::string shadow;                // where paths under the replaced target went
    std::vector<std::string> pending;  // directories whose SyncDir it awaits
    Replaced replaced;
  };

  void AddEntry(Entry::Kind kind, std::string path, std::string from, Replaced replaced) {
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

  // Moves everything under `from` to `to`: the first `end` entries and every
  // tracked file.
  void RekeyAll(absl::string_view from, absl::string_view to, size_t end) {
    for (size_t i = 0; i < end; ++i) {
      Entry& e = entries_[i];
      Rekey(e.path, from, to);
      Rekey(e.from, from, to);
      for (std::string& dir : e.pending) Rekey(dir, from, to);
    }
    for (const auto& file : files_) Rekey(file->path, from, to);
  }

  // Swaps the paths under `a` with those under `b`, as `RekeyAll` does.
  void SwapAll(const std::string& a, const std::string& b, size_t end) {
    const std::string parked = absl::StrCat(std::string(1, kShadowMark), "swap:", next_id_++);
    RekeyAll(a, parked, end);
    RekeyAll(b, a, end);
    RekeyAll(parked, b, end);
  }

  void ForgetFiles(const std::string& path) {
    std::erase_if(files_, [&](const std::shared_ptr<TrackedFile>& file) {
      if (!IsUnder(file->path, path)) return false;
      file->path.clear();
      return true;
    });
  }

  absl::Status RemoveTree(const std::string& path) {
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

  absl::Status WriteFile(const std::string& path, std::string& bytes) {
    OpenOptions options;
    options.write = options.create = options.truncate = true;
    absl::StatusOr<std::unique_ptr<File>> file = base_->Open(path, options);
    if (!file.ok()) return file.status();
    absl::Status status = Transfer(*base_, **file, IoOp::Kind::kWrite, bytes.data(), bytes.size());
    if (!status.ok()) return status;
    return (*file)->Close();
  }

  absl::Status TruncateTo(const std::string& path, uint64_t size) {
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

  const std::shared_ptr<FileSystem> base_;
  std::vector<Entry> entries_;
  std::vector<std::shared_ptr<TrackedFile>> files_;
  uint64_t next_id_ = 1;
};

}  // namespace fault_internal

absl::string_view FaultName(Fault fault) {
  switch (fault) {
    case Fault::kNone: return "none";
    case Fault::kEio: return "EIO";
    case Fault::kEnospc: return "ENOSPC";
    case Fault::kShortTransfer: return "short transfer";
    case Fault::kEintr: return "EINTR";
    case Fault::kCrash: return "crash";
  }
  return "invalid";
}

class FaultInjectionFileSystem::State {
 public:
  explicit State(std::shared_ptr<FileSystem> base) : log_(std::move(base)) {}

  // Counts one call and returns the fault to inject into it (kNone for none).
  // `io_op` says whether the call is an I/O op: only those take kShortTransfer
  // and kEintr. `describe` names the call; it runs only when a fault fires.
  Fault OnCall(bool io_op, absl::FunctionRef<std::string()> describe) ABSL_LOCKS_EXCLUDED(mu_) {
    internal::MutexLock lock(&mu_);
    ++count_;
    if (record_) recorded_.push_back(describe());
    Fault fault = Fault::kNone;
    if (crashed_) {
      fault = Fault::kCrash;
    } else if (count_ == fail_at_ && fault_ != Fault::kNone) {
      fault = fault_;
      if (!io_op && (fault == Fault::kShortTransfer || fault == Fault::kEintr)) {
        fault = Fault::kNone;
      }
      if (fault == Fault::kCrash) crashed_ = true;
    }
    if (fault != Fault::kNone) {
      if (injected_++ == 0) first_injected_ = absl::StrCat(describe(), " [", std::string(FaultName(fault)), "]");
    }
    return fault;
  }

  absl::Duration io_delay() const ABSL_LOCKS_EXCLUDED(mu_) {
    internal::MutexLock lock(&mu_);
    return io_delay_;
  }

  // Blocks while I/O is held (a hung disk), counting the held submitters.
  void WaitWhileIoHeld() ABSL_LOCKS_EXCLUDED(mu_) {
    internal::MutexLock lock(&mu_);
    if (!io_held_) return;
    ++io_held_waiters_;
    mu_.Await([this] { return !io_held_; });
    --io_held_waiters_;
  }

  mutable internal::Mutex mu_;
  uint64_t count_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t fail_at_ ABSL_GUARDED_BY(mu_) = 0;
  Fault fault_ ABSL_GUARDED_BY(mu_) = Fault::kNone;
  bool crashed_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t injected_ ABSL_GUARDED_BY(mu_) = 0;
  bool record_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::string> recorded_ ABSL_GUARDED_BY(mu_);
  std::string first_injected_ ABSL_GUARDED_BY(mu_);
  absl::Duration io_delay_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  bool io_held_ ABSL_GUARDED_BY(mu_) = false;
  size_t io_held_waiters_ ABSL_GUARDED_BY(mu_) = 0;
  bool exchange_supported_ ABSL_GUARDED_BY(mu_) = true;
  fault_internal::DurabilityLog log_ ABSL_GUARDED_BY(mu_);
};

namespace {

using State = FaultInjectionFileSystem::State;

// The status an injected fault gives a call that is not an I/O op. `what`
// names the call and its path, e.g. "rename /a to /b".
absl::Status FaultStatus(Fault fault, const std::string& what) {
  switch (fault) {
    case Fault::kEio:
      return ckpt::internal::ErrnoToStatus(EIO, absl::StrCat("injected fault: ", what));
    case Fault::kEnospc:
      return ckpt::internal::ErrnoToStatus(ENOSPC, absl::StrCat("injected fault: ", what));
    case Fault::kCrash: return absl::AbortedError(absl::StrCat("simulated crash: ", what));
    default: return absl::OkStatus();
  }
}

// Counts a call that is not an I/O op; returns the status it must fail with,
// or OK to let it proceed.
absl::Status Check(State& state, const std::string& what) {
  return FaultStatus(state.OnCall(/*io_op=*/false, [&] { return what; }), what);
}

#define CKPT_FAULT_CHECK(state, what)              \
  do {                                             \
    absl::Status fault_status_ = Check(state, what); \
    if (!fault_status_.ok()) return fault_status_; \
  } while (false)

class FaultFile final : public File {
 public:
  FaultFile(std::shared_ptr<State> state, std::unique_ptr<File> base,
            std::shared_ptr<fault_internal::TrackedFile> tracked)
      : state_(std::move(state)), base_(std::move(base)), tracked_(std::move(tracked)) {}

  File* base() const { return base_.get(); }

  const std::string& path() const override { return base_->path(); }
  bool direct() const override { return base_->direct(); }
  int native_handle() const override { return base_->native_handle(); }

  absl::Status Sync() override {
    CKPT_FAULT_CHECK(*state_, absl::StrCat("fsync ", path()));
    absl::Status status = base_->Sync();
    if (!status.ok() || tracked_ == nullptr) return status;
    absl::StatusOr<uint64_t> size = base_->Size();
    if (!size.ok()) return size.status();
    internal::MutexLock lock(&state_->mu_);
    state_->log_.FileSynced(*tracked_, *size);
    return absl::OkStatus();
  }

  absl::Status Truncate(uint64_t size) override {
    CKPT_FAULT_CHECK(*state_, absl::StrCat("ftruncate ", path(), " to ", size));
    return base_->Truncate(size);
  }

  absl::Status Allocate(uint64_t size) override {
    CKPT_FAULT_CHECK(*state_, absl::StrCat("fallocate ", path(), " to ", size));
    return base_->Allocate(size);
  }

  absl::StatusOr<uint64_t> Size() override {
    CKPT_FAULT_CHECK(*state_, absl::StrCat("fstat ", path()));
    return base_->Size();
  }

  absl::Status DropCache() override {
    CKPT_FAULT_CHECK(*state_, absl::StrCat("posix_fadvise ", path()));
    return base_->DropCache();
  }

  absl::Status Close() override {
    absl::Status fault = Check(*state_, absl::StrCat("close ", path()));
    if (!fault.ok()) {
      // close(2) releases the descriptor even when it fails; so does a crash.
      (void)base_->Close();
      return fault;
    }
    return base_->Close();
  }

 private:
  const std::shared_ptr<State> state_;
  const std::unique_ptr<File> base_;
  const std::shared_ptr<fault_internal::TrackedFile> tracked_;  // null unless opened for writing
};

// The length of a short transfer of `length` bytes, or 0 if there is none.
uint32_t ShortLength(uint32_t length, bool direct) {
  if (direct) {
    if (length < 2 * kDirectIoAlignment) return 0;
    return static_cast<uint32_t>((length / 2) / kDirectIoAlignment * kDirectIoAlignment);
  }
  return length >= 2 ? length / 2 : 0;
}

class FaultIoQueue final : public IoQueue {
 public:
  FaultIoQueue(std::shared_ptr<State> state, std::unique_ptr<IoQueue> base)
      : state_(std::move(state)), base_(std::move(base)) {}

  absl::string_view name() const override { return base_->name(); }
  size_t depth() const override { return base_->depth(); }
  absl::Status RegisterBuffers(std::span<const iovec> buffers) override {
    return base_->RegisterBuffers(buffers);
  }

  absl::Status Submit(std::span<const IoOp> ops) override {
    state_->WaitWhileIoHeld();
    absl::Duration delay = state_->io_delay();
    if (delay > absl::ZeroDuration()) absl::SleepFor(delay * static_cast<int64_t>(ops.size()));
    std::vector<IoOp> base_ops;
    std::vector<IoCompletion> injected;
    base_ops.reserve(ops.size());
    for (const IoOp& op : ops) {
      IoOp base_op = op;
      if (auto* file = dynamic_cast<FaultFile*>(op.file)) base_op.file = file->base();
      Fault fault = state_->OnCall(/*io_op=*/true, [&] { return Describe(op); });
      if (fault == Fault::kShortTransfer) {
        base_op.length = op.file != nullptr ? ShortLength(op.length, op.file->direct()) : 0;
        if (base_op.length == 0) fault = Fault::kEintr;
      }
      switch (fault) {
        case Fault::kNone:
        case Fault::kShortTransfer: base_ops.push_back(base_op); break;
        case Fault::kEio:
        case Fault::kCrash: injected.push_back({op.tag, -EIO}); break;
        case Fault::kEnospc: injected.push_back({op.tag, -ENOSPC}); break;
        case Fault::kEintr: injected.push_back({op.tag, -EINTR}); break;
      }
    }
    if (!base_ops.empty()) {
      absl::Status status = base_->Submit(base_ops);
      if (!status.ok()) return status;
    }
    internal::MutexLock lock(&mu_);
    injected_.insert(injected_.end(), injected.begin(), injected.end());
    return absl::OkStatus();
  }

  absl::Status Reap(size_t min_complete, std::vector<IoCompletion>* out) override {
    size_t taken;
    {
      internal::MutexLock lock(&mu_);
      taken = injected_.size();
      out->insert(out->end(), injected_.begin(), injected_.end());
      injected_.clear();
    }
    return base_->Reap(min_complete > taken ? min_complete - taken : 0, out);
  }

 private:
  static std::string Describe(const IoOp& op) {
    return absl::StrCat("IoOp ", op.kind == IoOp::Kind::kWrite ? "write " : "read ",
                        op.file != nullptr ? op.file->path() : "(null file)", "@", op.offset,
                        "+", op.length);
  }

  const std::shared_ptr<State> state_;
  const std::unique_ptr<IoQueue> base_;
  internal::Mutex mu_;
  // Completions of ops that failed by injection, returned by the next `Reap`.
  std::vector<IoCompletion> injected_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

FaultInjectionFileSystem::FaultInjectionFileSystem(std::shared_ptr<FileSystem> base)
    : base_(std::move(base)), state_(std::make_shared<State>(base_)) {}

FaultInjectionFileSystem::~FaultInjectionFileSystem() = default;

uint64_t FaultInjectionFileSystem::call_count() const {
  internal::MutexLock lock(&state_->mu_);
  return state_->count_;
}

void FaultInjectionFileSystem::ResetCallCount() {
  internal::MutexLock lock(&state_->mu_);
  state_->count_ = 0;
  state_->recorded_.clear();
}

void FaultInjectionFileSystem::RecordCalls(bool on) {
  internal::MutexLock lock(&state_->mu_);
  state_->record_ = on;
}

std::vector<std::string> FaultInjectionFileSystem::recorded_calls() const {
  internal::MutexLock lock(&state_->mu_);
  return state_->recorded_;
}

void FaultInjectionFileSystem::FailAt(uint64_t n, Fault fault) {
  internal::MutexLock lock(&state_->mu_);
  state_->fail_at_ = n;
  state_->fault_ = fault;
}

void FaultInjectionFileSystem::ClearFaults() {
  internal::MutexLock lock(&state_->mu_);
  state_->fail_at_ = 0;
  state_->fault_ = Fault::kNone;
  state_->crashed_ = false;
}

bool FaultInjectionFileSystem::crashed() const {
  internal::MutexLock lock(&state_->mu_);
  return state_->crashed_;
}

uint64_t FaultInjectionFileSystem::injected_count() const {
  internal::MutexLock lock(&state_->mu_);
  return state_->injected_;
}

std::string FaultInjectionFileSystem::first_injected_call() const {
  internal::MutexLock lock(&state_->mu_);
  return state_->first_injected_;
}

void FaultInjectionFileSystem::SetIoDelay(absl::Duration delay) {
  internal::MutexLock lock(&state_->mu_);
  state_->io_delay_ = delay;
}

void FaultInjectionFileSystem::HoldIo(bool hold) {
  internal::MutexLock lock(&state_->mu_);  // unlocking wakes held submitters
  state_->io_held_ = hold;
}

size_t FaultInjectionFileSystem::io_held_waiters() const {
  internal::MutexLock lock(&state_->mu_);
  return state_->io_held_waiters_;
}

void FaultInjectionFileSystem::SetExchangeSupported(bool supported) {
  internal::MutexLock lock(&state_->mu_);
  state_->exchange_supported_ = supported;
}

absl::Status FaultInjectionFileSystem::DropUnsyncedData() {
  internal::MutexLock lock(&state_->mu_);
  return state_->log_.DropUnsynced();
}

absl::StatusOr<std::unique_ptr<File>> FaultInjectionFileSystem::Open(const std::string& path,
                                                                     const OpenOptions& options) {
  CKPT_FAULT_CHECK(*state_, absl::StrCat("open ", path));
  const bool existed = !options.create || base_->Stat(path).ok();
  absl::StatusOr<std::unique_ptr<File>> file = base_->Open(path, options);
  if (!file.ok()) return file.status();
  std::shared_ptr<fault_internal::TrackedFile> tracked;
  if (options.write) {
    uint64_t size = 0;
    if (existed && !options.truncate) {
      absl::StatusOr<uint64_t> current = (*file)->Size();
      if (!current.ok()) return current.status();
      size = *current;
    }
    internal::MutexLock lock(&state_->mu_);
    tracked = state_->log_.FileOpened(path, /*created=*/!existed, options.truncate, size);
  } else if (!existed) {
    internal::MutexLock lock(&state_->mu_);
    state_->log_.Created(path);
  }
  return std::unique_ptr<File>(
      std::make_unique<FaultFile>(state_, std::move(*file), std::move(tracked)));
}

absl::Status FaultInjectionFileSystem::CreateDir(const std::string& path) {
  CKPT_FAULT_CHECK(*state_, absl::StrCat("mkdir ", path));
  absl::Status status = base_->CreateDir(path);
  if (!status.ok()) return status;
  internal::MutexLock lock(&state_->mu_);
  state_->log_.Created(path);
  return absl::OkStatus();
}

absl::Status FaultInjectionFileSystem::RemoveFile(const std::string& path) {
  CKPT_FAULT_CHECK(*state_, absl::StrCat("unlink ", path));
  absl::Status status = base_->RemoveFile(path);
  if (!status.ok()) return status;
  internal::MutexLock lock(&state_->mu_);
  state_->log_.Removed(path);
  return absl::OkStatus();
}

absl::Status FaultInjectionFileSystem::RemoveDir(const std::string& path) {
  CKPT_FAULT_CHECK(*state_, absl::StrCat("rmdir ", path));
  absl::Status status = base_->RemoveDir(path);
  if (!status.ok()) return status;
  internal::MutexLock lock(&state_->mu_);
  state_->log_.Removed(path);
  return absl::OkStatus();
}

absl::Status FaultInjectionFileSystem::Rename(const std::string& from, const std::string& to,
                                              RenameMode mode) {
  CKPT_FAULT_CHECK(*state_, absl::StrCat("rename ", from, " to ", to));
  // What a kReplace rename replaces, so that undoing it can put it back.
  fault_internal::Replaced replaced;
  if (mode == RenameMode::kReplace) replaced = fault_internal::SaveReplaced(*base_, to);
  absl::Status status = base_->Rename(from, to, mode);
  if (!status.ok()) return status;
  internal::MutexLock lock(&state_->mu_);
  state_->log_.Renamed(from, to, std::move(replaced));
  return absl::OkStatus();
}

absl::Status FaultInjectionFileSystem::Exchange(const std::string& a, const std::string& b) {
  const std::string what = absl::StrCat("exchange ", a, " and ", b);
  CKPT_FAULT_CHECK(*state_, what);
  {
    internal::MutexLock lock(&state_->mu_);
    if (!state_->exchange_supported_) {
      return absl::UnimplementedError(absl::StrCat(what, ": RENAME_EXCHANGE is not supported (simulated)"));
    }
  }
  absl::Status status = base_->Exchange(a, b);
  if (!status.ok()) return status;
  internal::MutexLock lock(&state_->mu_);
  state_->log_.Exchanged(a, b);
  return absl::OkStatus();
}

absl::Status FaultInjectionFileSystem::SyncDir(const std::string& path) {
  CKPT_FAULT_CHECK(*state_, absl::StrCat("fsync directory ", path));
  absl::Status status = base_->SyncDir(path);
  if (!status.ok()) return status;
  internal::MutexLock lock(&state_->mu_);
  state_->log_.DirSynced(path);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> FaultInjectionFileSystem::ListDir(
    const std::string& path) {
  CKPT_FAULT_CHECK(*state_, absl::StrCat("opendir ", path));
  return base_->ListDir(path);
}

absl::StatusOr<FileStat> FaultInjectionFileSystem::Stat(const std::string& path) {
  CKPT_FAULT_CHECK(*state_, absl::StrCat("stat ", path));
  return base_->Stat(path);
}

absl::StatusOr<std::unique_ptr<FileLock>> FaultInjectionFileSystem::LockFile(
    const std::string& path, absl::string_view owner) {
  CKPT_FAULT_CHECK(*state_, absl::StrCat("lock ", path));
  const bool existed = base_->Stat(path).ok();
  absl::StatusOr<std::unique_ptr<FileLock>> lock = base_->LockFile(path, owner);
  if (!lock.ok()) return lock.status();
  if (!existed) {
    internal::MutexLock guard(&state_->mu_);
    state_->log_.Created(path);
  }
  return lock;
}

absl::StatusOr<std::unique_ptr<IoQueue>> FaultInjectionFileSystem::NewIoQueue(IoQueueKind kind,
                                                                            size_t depth) {
  CKPT_FAULT_CHECK(*state_, absl::StrCat("new I/O queue (",
                                         kind == IoQueueKind::kUring ? "io_uring" : "threads",
                                         ", depth ", depth, ")"));
  absl::StatusOr<std::unique_ptr<IoQueue>> queue = base_->NewIoQueue(kind, depth);
  if (!queue.ok()) return queue.status();
  return std::unique_ptr<IoQueue>(std::make_unique<FaultIoQueue>(state_, std::move(*queue)));
}

}  // namespace ckpt::testing
