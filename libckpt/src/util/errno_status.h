// Converting errno values into absl::Status, in one place.
#ifndef CKPT_UTIL_ERRNO_STATUS_H_
#define CKPT_UTIL_ERRNO_STATUS_H_

#include "absl/strings/string_view.h"

#include "absl/status/status.h"

namespace ckpt::internal {

// `ErrnoToStatus(ENOSPC, "write shard /r/x")` is
// kResourceExhausted("write shard /r/x: No space left on device (ENOSPC)").
// Codes: ENOENT kNotFound, EEXIST/ENOTEMPTY kAlreadyExists, ENOSPC/EDQUOT
// kResourceExhausted, EACCES/EPERM kPermissionDenied, EINVAL/ENOTDIR/EISDIR
// kInvalidArgument (kFailedPrecondition for ENOTDIR), ENOSYS/EOPNOTSUPP
// kUnimplemented, anything else (EIO, ...) kInternal.
absl::Status ErrnoToStatus(int error, absl::string_view context);

// The symbolic name of `error` ("ENOSPC"), or its number as text.
absl::string_view ErrnoName(int error);

}  // namespace ckpt::internal

#endif  // CKPT_UTIL_ERRNO_STATUS_H_
