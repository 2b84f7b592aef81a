// ckpt/version.h: the library's version, as CMakeLists.txt's `project(ckpt
// VERSION ...)` gives it (the one place it is written; pyproject.toml and the
// Python package's `__version__` take it from there too).
#ifndef CKPT_VERSION_H_
#define CKPT_VERSION_H_

#include "absl/strings/string_view.h"

namespace ckpt {

// "0.1.0".
absl::string_view Version();

}  // namespace ckpt

#endif  // CKPT_VERSION_H_
