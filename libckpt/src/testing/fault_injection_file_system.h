// A `FileSystem` for tests that injects faults and models power loss.
//
// Modelled on LevelDB's FaultInjectionTestEnv and RocksDB's
// FaultInjectionTestFS: it wraps a real file system, counts every call that
// goes through it, fails the Nth one on request, and remembers what has been
// made durable (file sizes at their last `Sync`, directory entries at their
// directory's last `SyncDir`) so that `DropUnsyncedData` can roll the real
// tree back to what a power loss would leave.
//
//   auto fs = std::make_shared<FaultInjectionFileSystem>(ckpt::PosixFileSystem());
//   ... run a save with `options.fs = fs`, read `fs->call_count()` ...
//   fs->FailAt(n, Fault::kCrash);
//   ... run the save again: call n and every later call fail ...
//   engine.reset();
//   ASSERT_TRUE(fs->DropUnsyncedData().ok());
//
// What is counted: every `FileSystem` method (`name` excepted), every `File`
// method that does something (`ReadAt`, `WriteAt`, `Sync`, `Truncate`,
// `Allocate`, `Size`, `DropCache`, `Close`; not the accessors), and every
// `IoOp` passed to `IoQueue::Submit` (one count per op). A `ReadAt` or
// `WriteAt` counts once, whatever its length. `IoQueue::Reap`,
// `RegisterBuffers`, `name` and `depth` are not counted: how often a caller
// reaps depends on timing, and counts must repeat from one run to the next.
//
// The transfers are the `IoOp`s, `ReadAt` and `WriteAt`: only they take
// kShortTransfer and kEintr, and only they wait for `SetIoDelay` and
// `HoldIo`. `IsTransferCall` tells them apart in `recorded_calls()`.
//
// Thread-safe.
#ifndef CKPT_TESTING_FAULT_INJECTION_FILE_SYSTEM_H_
#define CKPT_TESTING_FAULT_INJECTION_FILE_SYSTEM_H_

#include <cstdint>
#include <memory>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/base/thread_annotations.h"
#include "util/mutex.h"
#include "absl/time/time.h"
#include "ckpt/file_system.h"
#include "ckpt/file_system_wrapper.h"

namespace ckpt::testing {

enum class Fault : uint8_t {
  kNone,
  // The call fails with EIO: a `Status` with code kInternal naming the path
  // (`ReadAt` and `WriteAt` included), or, for an `IoOp`, a completion of
  // -EIO. Nothing reaches the base.
  kEio,
  // Like kEio with ENOSPC: kResourceExhausted, or a completion of -ENOSPC.
  kEnospc,
  // Transfers only: the kernel moved part of the bytes. The part is a
  // positive multiple of 4096 for O_DIRECT files (possible when length >=
  // 8192); otherwise it is at least 1 byte and less than the length. An
  // `IoOp` transfers the part and its completion reports that count (the
  // caller must resubmit the rest). `ReadAt` and `WriteAt` retry inside the
  // call, as their contract says: the base file gets two calls, the part
  // and then the rest, and the caller sees every byte moved (a read still
  // stops at end of file). Where no part exists (length <= 1, or an O_DIRECT
  // transfer of one block) it behaves as kEintr. Other calls proceed
  // unharmed.
  kShortTransfer,
  // Transfers only: the call was interrupted before moving anything. An
  // `IoOp` completes with -EINTR (the caller resubmits it); `ReadAt` and
  // `WriteAt` retry inside the call, so they proceed as if unharmed. Other
  // calls proceed unharmed.
  kEintr,
  // Power loss: this call and every later one fail with kAborted ("simulated
  // crash ..."), `ReadAt` and `WriteAt` included; `IoOp`s complete with -EIO.
  // Nothing reaches the base any more, except that open files are still
  // closed (silently) and transfers already started are still reaped, so no
  // memory is written after its owner frees it.
  kCrash,
};

absl::string_view FaultName(Fault fault);

// Whether `call`, an entry of `FaultInjectionFileSystem::recorded_calls()`,
// is a transfer (an `IoOp`, `ReadAt` or `WriteAt`): the calls that take
// kShortTransfer and kEintr.
bool IsTransferCall(absl::string_view call);

// Forwards to its base file system (`FileSystemWrapper`), counting every
// call, failing the armed one, and keeping what a crash would lose.
class FaultInjectionFileSystem final : public FileSystemWrapper {
 public:
  // Shared by the file system, its files and its queues (which may outlive
  // it): counts, the armed fault and the durability bookkeeping.
  class State;

  explicit FaultInjectionFileSystem(std::shared_ptr<FileSystem> base);
  ~FaultInjectionFileSystem() override;

  // ---- Faults ----

  // Calls counted so far (since construction or `ResetCallCount`).
  uint64_t call_count() const;
  void ResetCallCount();
  // Arms `fault` for the call that makes `call_count()` equal `n`, replacing
  // any fault armed before. kNone disarms.
  void FailAt(uint64_t n, Fault fault);
  // Disarms the fault and ends a simulated crash: later calls reach the base.
  void ClearFaults();
  // True once a kCrash fault fired (until `ClearFaults`).
  bool crashed() const;
  // How many calls a fault was injected into (a crash counts every call it
  // failed), and a description ("rename /a to /b", "IoOp write /f@4096+65536",
  // "WriteAt /f@0+312") of the first one; empty if none.
  uint64_t injected_count() const;
  std::string first_injected_call() const;

  // With `on`, keeps a description of every counted call, in order (call n
  // at index n - 1), until `ResetCallCount`. Off by default.
  void RecordCalls(bool on);
  std::vector<std::string> recorded_calls() const;

  // Every transfer (each `IoOp`, `ReadAt`, `WriteAt`) waits `delay` before
  // it starts (a slow disk). Zero disables.
  void SetIoDelay(absl::Duration delay);
  // While held, `IoQueue::Submit`, `ReadAt` and `WriteAt` block (a hung disk:
  // the calling thread is stuck in the call) until `HoldIo(false)`.
  void HoldIo(bool hold);
  // How many callers are blocked by `HoldIo` now.
  size_t io_held_waiters() const;

  // With `false`, `Exchange` fails (still counted) with kUnimplemented, as on
  // a file system without RENAME_EXCHANGE. On by default (it then needs the
  // base file system to support it).
  void SetExchangeSupported(bool supported);

  // ---- Durability ----

  // Rolls the real tree back to what a power loss now would leave, then
  // forgets the history (what remains is taken as durable):
  // - entries created (files, directories), renames and exchanges done
  //   through this file system since their directory's last successful
  //   `SyncDir` are undone, in reverse order: renames are renamed back
  //   (restoring a file that a kReplace rename replaced), exchanges are
  //   exchanged back, created entries are removed (recursively);
  // - every surviving file opened for writing through this file system is
  //   truncated to its size at its last successful `Sync` (0 if never synced;
  //   its size at open if it existed then and was not truncated): bytes
  //   written after it, by `IoOp`s or `WriteAt` alike, are lost.
  // Simplifications: `RemoveFile` and `RemoveDir` are durable at once; data
  // overwritten in place after a sync is not rolled back; a rename over an
  // existing directory, or over a file larger than 1 MiB, is undone without
  // restoring what it replaced; a rename (or an exchange) is durable once the
  // directories of both its source and its target have been synced.
  // REQUIRES: nothing uses the file system concurrently (destroy the engine
  // first). Returns the first error met; it still undoes what it can.
  absl::Status DropUnsyncedData();

  // ---- FileSystem ----

  absl::string_view name() const override { return "fault-injection"; }
  // (Every call is counted, so every call is overridden.)
  absl::StatusOr<std::unique_ptr<File>> Open(const std::string& path,
                                             const OpenOptions& options) override;
  absl::Status CreateDir(const std::string& path) override;
  absl::Status RemoveFile(const std::string& path) override;
  absl::Status RemoveDir(const std::string& path) override;
  absl::Status Rename(const std::string& from, const std::string& to, RenameMode mode) override;
  absl::Status Exchange(const std::string& a, const std::string& b) override;
  absl::Status SyncDir(const std::string& path) override;
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) override;
  absl::StatusOr<FileStat> Stat(const std::string& path) override;
  absl::StatusOr<std::unique_ptr<FileLock>> LockFile(const std::string& path,
                                                     absl::string_view owner) override;
  absl::StatusOr<std::unique_ptr<IoQueue>> NewIoQueue(IoQueueKind kind, size_t depth) override;

 private:
  FileSystem& base() const { return target(); }

  const std::shared_ptr<State> state_;
};

}  // namespace ckpt::testing

#endif  // CKPT_TESTING_FAULT_INJECTION_FILE_SYSTEM_H_
