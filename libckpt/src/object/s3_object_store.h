// The S3 dialect of `ObjectStore` (ckpt/object_store.h).
#ifndef CKPT_OBJECT_S3_OBJECT_STORE_H_
#define CKPT_OBJECT_S3_OBJECT_STORE_H_

#include <memory>
#include <string>

#include "ckpt/object_store.h"
#include "object/credentials.h"

namespace ckpt::internal {

std::shared_ptr<ObjectStore> NewS3ObjectStore(std::string bucket, ResolvedConfig config,
                                              const ObjectStoreOptions& options);

// What a failed S3 response means as a status code: 404 kNotFound, 403
// kPermissionDenied, 412 kFailedPrecondition, 409 kAborted, other 4xx
// kInvalidArgument, 5xx kUnavailable.
absl::StatusCode CodeForHttpStatus(int status);
// Whether a response with this status and S3 error code may succeed when
// sent again (5xx, 429, SlowDown, RequestTimeout, InternalError, and the
// refusals of a body damaged on the way: BadDigest, XAmzContentSHA256Mismatch).
bool IsRetryable(int status, absl::string_view s3_code);
// Whether it asks for fewer requests (503, 429, SlowDown): the store's
// RequestWindow then halves what it sends.
bool IsThrottled(int status, absl::string_view s3_code);

}  // namespace ckpt::internal

#endif  // CKPT_OBJECT_S3_OBJECT_STORE_H_
