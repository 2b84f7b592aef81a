#include "c10d_store.h"

#include <chrono>
#include <cstdint>
#include <exception>
#include <utility>
#include <vector>

#include <c10/util/Exception.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace ckpt::torch_ext {
namespace {

constexpr char kTag = 'v';

std::vector<uint8_t> Tagged(const std::string& value) {
  std::vector<uint8_t> out;
  out.reserve(value.size() + 1);
  out.push_back(static_cast<uint8_t>(kTag));
  out.insert(out.end(), value.begin(), value.end());
  return out;
}

// The value without its tag. A value without one was set by someone else
// than a C10dStore (the engine's keys are its own); it is returned whole.
std::string Untagged(const std::vector<uint8_t>& stored) {
  if (!stored.empty() && stored[0] == static_cast<uint8_t>(kTag)) {
    return std::string(stored.begin() + 1, stored.end());
  }
  return std::string(stored.begin(), stored.end());
}

// The first line of a c10 message: no "Exception raised from ..." trace.
std::string Message(const std::exception& e) {
  std::string text;
  if (const auto* c10 = dynamic_cast<const c10::Error*>(&e)) {
    text = c10->what_without_backtrace();
  } else {
    text = e.what();
  }
  if (size_t nl = text.find('\n'); nl != std::string::npos) text.resize(nl);
  return text;
}

bool SaysTimeout(const std::string& message) {
  const std::string lower = absl::AsciiStrToLower(message);
  return absl::StrContains(lower, "timeout") || absl::StrContains(lower, "timed out");
}

bool SaysUnreachable(const std::string& message) {
  const std::string lower = absl::AsciiStrToLower(message);
  for (const char* words : {"connect", "reset by peer", "broken pipe", "closed", "socket",
                            "eof", "network"}) {
    if (absl::StrContains(lower, words)) return true;
  }
  return false;
}

std::chrono::milliseconds WaitTimeout(absl::Duration timeout) {
  if (timeout == absl::InfiniteDuration()) return std::chrono::milliseconds::zero();  // c10d: none
  const int64_t ms = absl::ToInt64Milliseconds(timeout);
  return std::chrono::milliseconds(ms < 1 ? 1 : ms);
}

}  // namespace

absl::Status StoreErrorStatus(const std::exception& e, const std::string& what) {
  const std::string message = Message(e);
  const std::string text = absl::StrCat("c10d store: ", what, ": ", message);
  if (SaysTimeout(message)) return absl::DeadlineExceededError(text);
  if (dynamic_cast<const c10::DistNetworkError*>(&e) != nullptr || SaysUnreachable(message)) {
    return absl::UnavailableError(text);
  }
  if (dynamic_cast<const c10::NotImplementedError*>(&e) != nullptr) {
    return absl::UnimplementedError(text);
  }
  if (dynamic_cast<const c10::DistError*>(&e) != nullptr) return absl::UnavailableError(text);
  return absl::UnknownError(text);
}

absl::Status C10dStore::Set(const std::string& key, const std::string& value) {
  try {
    store_->set(key, Tagged(value));
    return absl::OkStatus();
  } catch (const std::exception& e) {
    return StoreErrorStatus(e, absl::StrCat("set key \"", key, "\""));
  } catch (...) {
    return absl::UnknownError(absl::StrCat("c10d store: set key \"", key, "\": unknown exception"));
  }
}

absl::StatusOr<std::string> C10dStore::Get(const std::string& key, absl::Duration timeout) {
  const std::chrono::milliseconds ms = WaitTimeout(timeout);
  try {
    store_->wait({key}, ms);
  } catch (const std::exception& e) {
    absl::Status status = StoreErrorStatus(
        e, absl::StrCat("wait ", ms.count() == 0 ? std::string("without timeout")
                                                 : absl::StrCat(ms.count(), " ms"),
                        " for key \"", key, "\""));
    return status;
  } catch (...) {
    return absl::UnknownError(absl::StrCat("c10d store: wait for key \"", key, "\": unknown exception"));
  }
  try {
    return Untagged(store_->get(key));
  } catch (const std::exception& e) {
    return StoreErrorStatus(e, absl::StrCat("get key \"", key, "\""));
  } catch (...) {
    return absl::UnknownError(absl::StrCat("c10d store: get key \"", key, "\": unknown exception"));
  }
}

absl::StatusOr<std::string> C10dStore::SetIfAbsent(const std::string& key,
                                                   const std::string& value) {
  try {
    return Untagged(store_->compareSet(key, std::vector<uint8_t>{}, Tagged(value)));
  } catch (const std::exception& e) {
    return StoreErrorStatus(e, absl::StrCat("compare-and-set key \"", key, "\""));
  } catch (...) {
    return absl::UnknownError(
        absl::StrCat("c10d store: compare-and-set key \"", key, "\": unknown exception"));
  }
}

std::shared_ptr<CoordinationStore> NewC10dStore(const c10::intrusive_ptr<c10d::Store>& store) {
  c10::intrusive_ptr<c10d::Store> own;
  try {
    own = store->clone();
  } catch (...) {  // a store that cannot be cloned (a Python one): share it
  }
  return std::make_shared<C10dStore>(own ? std::move(own) : store);
}

}  // namespace ckpt::torch_ext
