// Status propagation macros (Debian's Abseil 20220623 ships none).
#ifndef CKPT_UTIL_STATUS_MACROS_H_
#define CKPT_UTIL_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define CKPT_CONCAT_INNER_(a, b) a##b
#define CKPT_CONCAT_(a, b) CKPT_CONCAT_INNER_(a, b)

// CKPT_RETURN_IF_ERROR(expr): returns the status of `expr` if it is not OK.
#define CKPT_RETURN_IF_ERROR(expr)                                  \
  do {                                                              \
    ::absl::Status ckpt_status_ = (expr);                           \
    if (!ckpt_status_.ok()) return ckpt_status_;                    \
  } while (false)

// CKPT_ASSIGN_OR_RETURN(lhs, expr): evaluates the StatusOr `expr`; returns its
// status on error, otherwise moves its value into `lhs` (which may declare).
#define CKPT_ASSIGN_OR_RETURN(lhs, expr) \
  CKPT_ASSIGN_OR_RETURN_IMPL_(CKPT_CONCAT_(ckpt_statusor_, __LINE__), lhs, expr)
#define CKPT_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return std::move(tmp).status();    \
  lhs = std::move(tmp).value()

namespace ckpt::internal {

// Returns `status` with `context` prepended to its message ("context: msg"),
// keeping its code and payloads. OK stays OK.
absl::Status Annotate(const absl::Status& status, absl::string_view context);

}  // namespace ckpt::internal

#endif  // CKPT_UTIL_STATUS_MACROS_H_
