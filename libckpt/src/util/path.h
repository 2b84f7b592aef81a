// Joining paths of the file-system seam (strings, never touched here).
#ifndef CKPT_UTIL_PATH_H_
#define CKPT_UTIL_PATH_H_

#include <string>

#include "absl/strings/string_view.h"

namespace ckpt::internal {

// `dir` "/" `name`, without doubling a trailing '/' of `dir`.
std::string JoinPath(absl::string_view dir, absl::string_view name);

}  // namespace ckpt::internal

#endif  // CKPT_UTIL_PATH_H_
