// The fault-injecting file system's own calls. Its files and queues are in
// fault_injection_io.cc, the shared state in fault_injection_state.cc, the
// power-loss model in fault_injection_log.cc.
#include "testing/fault_injection_file_system.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "testing/fault_injection_io.h"
#include "testing/fault_injection_log.h"
#include "testing/fault_injection_state.h"

namespace ckpt::testing {

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

bool IsTransferCall(absl::string_view call) {
  return absl::StartsWith(call, "IoOp ") || absl::StartsWith(call, "ReadAt ") ||
         absl::StartsWith(call, "WriteAt ");
}

FaultInjectionFileSystem::FaultInjectionFileSystem(std::shared_ptr<FileSystem> base)
    : FileSystemWrapper(std::move(base)), state_(std::make_shared<State>(shared_target())) {}

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
  const bool existed = !options.create || base().Stat(path).ok();
  absl::StatusOr<std::unique_ptr<File>> file = base().Open(path, options);
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
  return fault_internal::NewFaultFile(state_, std::move(*file), std::move(tracked));
}

absl::Status FaultInjectionFileSystem::CreateDir(const std::string& path) {
  CKPT_FAULT_CHECK(*state_, absl::StrCat("mkdir ", path));
  absl::Status status = base().CreateDir(path);
  if (!status.ok()) return status;
  internal::MutexLock lock(&state_->mu_);
  state_->log_.Created(path);
  return absl::OkStatus();
}

absl::Status FaultInjectionFileSystem::RemoveFile(const std::string& path) {
  CKPT_FAULT_CHECK(*state_, absl::StrCat("unlink ", path));
  absl::Status status = base().RemoveFile(path);
  if (!status.ok()) return status;
  internal::MutexLock lock(&state_->mu_);
  state_->log_.Removed(path);
  return absl::OkStatus();
}

absl::Status FaultInjectionFileSystem::RemoveDir(const std::string& path) {
  CKPT_FAULT_CHECK(*state_, absl::StrCat("rmdir ", path));
  absl::Status status = base().RemoveDir(path);
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
  if (mode == RenameMode::kReplace) replaced = fault_internal::SaveReplaced(base(), to);
  absl::Status status = base().Rename(from, to, mode);
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
  absl::Status status = base().Exchange(a, b);
  if (!status.ok()) return status;
  internal::MutexLock lock(&state_->mu_);
  state_->log_.Exchanged(a, b);
  return absl::OkStatus();
}

absl::Status FaultInjectionFileSystem::SyncDir(const std::string& path) {
  CKPT_FAULT_CHECK(*state_, absl::StrCat("fsync directory ", path));
  absl::Status status = base().SyncDir(path);
  if (!status.ok()) return status;
  internal::MutexLock lock(&state_->mu_);
  state_->log_.DirSynced(path);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> FaultInjectionFileSystem::ListDir(
    const std::string& path) {
  CKPT_FAULT_CHECK(*state_, absl::StrCat("opendir ", path));
  return base().ListDir(path);
}

absl::StatusOr<FileStat> FaultInjectionFileSystem::Stat(const std::string& path) {
  CKPT_FAULT_CHECK(*state_, absl::StrCat("stat ", path));
  return base().Stat(path);
}

absl::StatusOr<std::unique_ptr<FileLock>> FaultInjectionFileSystem::LockFile(
    const std::string& path, absl::string_view owner) {
  CKPT_FAULT_CHECK(*state_, absl::StrCat("lock ", path));
  const bool existed = base().Stat(path).ok();
  absl::StatusOr<std::unique_ptr<FileLock>> lock = base().LockFile(path, owner);
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
  absl::StatusOr<std::unique_ptr<IoQueue>> queue = base().NewIoQueue(kind, depth);
  if (!queue.ok()) return queue.status();
  return fault_internal::NewFaultIoQueue(state_, std::move(*queue));
}

}  // namespace ckpt::testing
