// torch_status.h: absl::Status -> a c10 exception (a Python exception).
#ifndef CKPT_TORCH_EXT_TORCH_STATUS_H_
#define CKPT_TORCH_EXT_TORCH_STATUS_H_

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ckpt::torch_ext {

// `ThrowIfError` returns when `status` is OK; otherwise it throws through
// TORCH_CHECK, so Python sees the library's message, prefixed with its code
// ("DATA_LOSS: ...") and with `context` ("ckpt: save step 7: ") when not
// empty. kInvalidArgument raises ValueError, kOutOfRange IndexError, any
// other code RuntimeError.
//
// Before throwing, it records the status code's name and the message it
// throws in a thread-local slot, which `TakeLastError` reads: callers learn
// the code from the status itself, never by parsing the message (whose
// context may hold anything, e.g. a root named "/data/RUN_A").
void ThrowIfError(const absl::Status& status, absl::string_view context = "");

// `ThrowIfSaveFailed` is `ThrowIfError` for the outcome of a save in flight
// (SaveHandle::Wait / WaitStaged): a failure there is the save's, found in
// the background, so it is always a RuntimeError (ckpt.CheckpointError, its
// code recorded as usual), kInvalidArgument included — e.g. a tensor that
// two ranks of a multi-rank save hold with different bytes.
void ThrowIfSaveFailed(const absl::Status& status, absl::string_view context);

// `TakeLastError` returns {code name, message} of the last error
// `ThrowIfError` threw on the calling thread (e.g. {"NOT_FOUND", "ckpt: load
// from /r: NOT_FOUND: ..."}), and clears the slot: {"", ""} if it threw none
// since the last call. A caller that caught an exception compares the message
// with the exception's to know that the code belongs to it (exceptions thrown
// by TORCH_CHECK elsewhere record nothing).
std::pair<std::string, std::string> TakeLastError();

}  // namespace ckpt::torch_ext

#endif  // CKPT_TORCH_EXT_TORCH_STATUS_H_
