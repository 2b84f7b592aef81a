// ckpt/root_lock.h: who may change a checkpoint root at the same time.
//
// A root has one writer: the engine that has it open holds
// ROOT/.ckpt-writer.lock from `Engine::Open` until `Close` (a second engine,
// in this process or another, fails at open). Retention jobs take
// ROOT/.ckpt-retain.lock, so two never run at once; they do not take the
// writer's lock, and run beside a writer by design (docs/retention.md says
// what each may do while the other runs). Readers take no lock.
//
// Both are flock(2) locks: released by the kernel the moment the holder dies,
// so a crashed trainer never leaves its root locked. The file holds one line
// saying who holds it ("ckpt engine, pid 4242 on host a, since
// 2026-12-01T20:30:00Z"), which is what the next locker's error quotes.
#ifndef CKPT_ROOT_LOCK_H_
#define CKPT_ROOT_LOCK_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ckpt/file_system.h"

namespace ckpt {

enum class RootLockKind : uint8_t {
  kWriter,     // ROOT/.ckpt-writer.lock: the engine saving into ROOT
  kRetention,  // ROOT/.ckpt-retain.lock: a retention/tiering job
};

// The lock file's name in ROOT.
absl::string_view RootLockFileName(RootLockKind kind);

// Takes the `kind` lock of `root` without waiting, for `holder` (what the
// owner line names, e.g. "ckpt-retain"). kUnavailable while it is held,
// naming the root and quoting the holder's line; kFailedPrecondition when a
// symlink, FIFO or directory stands in the lock file's place (refused, never
// followed or waited on); another code when it cannot be opened. `fs` null
// means `PosixFileSystem()`.
absl::StatusOr<std::unique_ptr<FileLock>> LockRoot(const std::string& root, RootLockKind kind,
                                                   absl::string_view holder,
                                                   FileSystem* fs = nullptr);

}  // namespace ckpt

#endif  // CKPT_ROOT_LOCK_H_
