#include "torch_status.h"

#include <string>
#include <utility>

#include <c10/util/Exception.h>

#include "absl/strings/str_cat.h"

namespace ckpt::torch_ext {
namespace {

// The last error `ThrowIfError` threw on this thread; see `TakeLastError`.
struct LastError {
  std::string code;
  std::string message;
};

LastError& ThreadLastError() {
  thread_local LastError last;
  return last;
}

}  // namespace

namespace {

std::string Record(const absl::Status& status, absl::string_view context) {
  const std::string message = absl::StrCat(context, status.ToString());
  LastError& last = ThreadLastError();
  last.code = absl::StatusCodeToString(status.code());
  last.message = message;
  return message;
}

}  // namespace

void ThrowIfSaveFailed(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return;
  const std::string message = Record(status, context);
  TORCH_CHECK(false, message);
}

void ThrowIfError(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return;
  const std::string message = Record(status, context);
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
      TORCH_CHECK_VALUE(false, message);
    case absl::StatusCode::kOutOfRange:
      TORCH_CHECK_INDEX(false, message);
    default:
      TORCH_CHECK(false, message);
  }
}

std::pair<std::string, std::string> TakeLastError() {
  LastError& last = ThreadLastError();
  std::pair<std::string, std::string> out(std::move(last.code), std::move(last.message));
  last.code.clear();
  last.message.clear();
  return out;
}

}  // namespace ckpt::torch_ext
