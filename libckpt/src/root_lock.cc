#include "ckpt/root_lock.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "format/names.h"

namespace ckpt {
namespace {

// "<holder>, pid <pid> on host <hostname>, since <UTC time>".
std::string OwnerLine(absl::string_view holder) {
  char host[256] = {0};
  if (::gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  return absl::StrCat(holder, ", pid ", ::getpid(), " on host ", host[0] != '\0' ? host : "?",
                      ", since ",
                      absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone()));
}

}  // namespace

absl::string_view RootLockFileName(RootLockKind kind) {
  return kind == RootLockKind::kWriter ? ".ckpt-writer.lock" : ".ckpt-retain.lock";
}

absl::StatusOr<std::unique_ptr<FileLock>> LockRoot(const std::string& root, RootLockKind kind,
                                                   absl::string_view holder, FileSystem* fs) {
  std::shared_ptr<FileSystem> posix;
  if (fs == nullptr) {
    posix = PosixFileSystem();
    fs = posix.get();
  }
  const std::string path = internal::JoinPath(root, RootLockFileName(kind));
  absl::StatusOr<std::unique_ptr<FileLock>> lock = fs->LockFile(path, OwnerLine(holder));
  if (lock.ok()) return lock;
  if (lock.status().code() == absl::StatusCode::kUnavailable) {
    return absl::UnavailableError(
        absl::StrCat("checkpoint root ", root, " is locked by another ",
                     kind == RootLockKind::kWriter ? "writer" : "retention job", ": ",
                     lock.status().message()));
  }
  return absl::Status(lock.status().code(),
                      absl::StrCat("checkpoint root ", root, ": ", lock.status().message()));
}

}  // namespace ckpt
