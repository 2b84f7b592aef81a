#include "util/errno_status.h"

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "util/status_macros.h"

namespace ckpt::internal {

absl::string_view ErrnoName(int error) {
  switch (error) {
    case EIO: return "EIO";
    case ENOSPC: return "ENOSPC";
    case EDQUOT: return "EDQUOT";
    case EINTR: return "EINTR";
    case EAGAIN: return "EAGAIN";
    case ENOENT: return "ENOENT";
    case EEXIST: return "EEXIST";
    case ENOTEMPTY: return "ENOTEMPTY";
    case EACCES: return "EACCES";
    case EPERM: return "EPERM";
    case EINVAL: return "EINVAL";
    case ENOTDIR: return "ENOTDIR";
    case EISDIR: return "EISDIR";
    case ENOSYS: return "ENOSYS";
    case EOPNOTSUPP: return "EOPNOTSUPP";
    case EROFS: return "EROFS";
    case EBADF: return "EBADF";
    case EFBIG: return "EFBIG";
    case ENOMEM: return "ENOMEM";
    case EMFILE: return "EMFILE";
    case EXDEV: return "EXDEV";
    default: return "errno";
  }
}

absl::Status ErrnoToStatus(int error, absl::string_view context) {
  std::string message = absl::StrCat(context, ": ", std::strerror(error), " (",
                                     ErrnoName(error), ")");
  switch (error) {
    case ENOENT: return absl::NotFoundError(message);
    case EEXIST:
    case ENOTEMPTY: return absl::AlreadyExistsError(message);
    case ENOSPC:
    case EDQUOT: return absl::ResourceExhaustedError(message);
    case EACCES:
    case EPERM:
    case EROFS: return absl::PermissionDeniedError(message);
    case ENOTDIR: return absl::FailedPreconditionError(message);
    case EINVAL:
    case EISDIR: return absl::InvalidArgumentError(message);
    case ENOSYS:
    case EOPNOTSUPP: return absl::UnimplementedError(message);
    case EAGAIN:
    case EINTR: return absl::UnavailableError(message);
    default: return absl::InternalError(message);
  }
}

absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  absl::Status annotated(status.code(), absl::StrCat(context, ": ", status.message()));
  status.ForEachPayload([&](absl::string_view type_url, const absl::Cord& payload) {
    annotated.SetPayload(type_url, payload);
  });
  return annotated;
}

}  // namespace ckpt::internal
