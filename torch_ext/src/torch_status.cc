#include "torch_status.h"

#include <string>

#include <c10/util/Exception.h>

#include "absl/strings/str_cat.h"

namespace ckpt::torch_ext {

void ThrowIfError(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return;
  const std::string message = absl::StrCat(context, status.ToString());
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
      TORCH_CHECK_VALUE(false, message);
    case absl::StatusCode::kOutOfRange:
      TORCH_CHECK_INDEX(false, message);
    default:
      TORCH_CHECK(false, message);
  }
}

}  // namespace ckpt::torch_ext
