#include "ckpt/version.h"

// Defined by libckpt/CMakeLists.txt from the project's version.
#ifndef CKPT_VERSION_STRING
#error "CKPT_VERSION_STRING is not defined: build through libckpt/CMakeLists.txt"
#endif

namespace ckpt {

absl::string_view Version() { return CKPT_VERSION_STRING; }

}  // namespace ckpt
