#include "util/path.h"

#include "absl/strings/str_cat.h"

namespace ckpt::internal {

std::string JoinPath(absl::string_view dir, absl::string_view name) {
  if (!dir.empty() && dir.back() == '/') return absl::StrCat(dir, name);
  return absl::StrCat(dir, "/", name);
}

}  // namespace ckpt::internal
