// torch_status.h: absl::Status -> a c10 exception (a Python exception).
#ifndef CKPT_TORCH_EXT_TORCH_STATUS_H_
#define CKPT_TORCH_EXT_TORCH_STATUS_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ckpt::torch_ext {

// `ThrowIfError` returns when `status` is OK; otherwise it throws through
// TORCH_CHECK, so Python sees the library's message, prefixed with its code
// ("DATA_LOSS: ...") and with `context` ("ckpt: save step 7: ") when not
// empty. kInvalidArgument raises ValueError, kOutOfRange IndexError, any
// other code RuntimeError.
void ThrowIfError(const absl::Status& status, absl::string_view context = "");

}  // namespace ckpt::torch_ext

#endif  // CKPT_TORCH_EXT_TORCH_STATUS_H_
