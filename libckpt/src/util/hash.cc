#include "util/hash.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ckpt::internal {

std::string HashToHex(uint64_t hash) { return absl::StrFormat("%016x", hash); }

absl::StatusOr<uint64_t> HashFromHex(absl::string_view hex) {
  if (hex.size() != 16) {
    return absl::DataLossError(absl::StrCat("checksum \"", hex, "\" is not 16 hex digits"));
  }
  uint64_t value = 0;
  for (char c : hex) {
    int digit;
    if (c >= '0' && c <= '9') digit = c - '0';
    else if (c >= 'a' && c <= 'f') digit = c - 'a' + 10;
    else return absl::DataLossError(absl::StrCat("checksum \"", hex, "\" is not lowercase hex"));
    value = (value << 4) | static_cast<uint64_t>(digit);
  }
  return value;
}

}  // namespace ckpt::internal
