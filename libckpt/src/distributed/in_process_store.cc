// `NewInProcessStore`: a `CoordinationStore` for ranks that are threads of
// one process (tests, tools).
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "ckpt/distributed.h"
#include "util/mutex.h"

namespace ckpt {
namespace {

class InProcessStore final : public CoordinationStore {
 public:
  absl::Status Set(const std::string& key, const std::string& value) override {
    internal::MutexLock lock(&mu_);
    values_[key] = value;
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    internal::MutexLock lock(&mu_);
    const bool found = mu_.AwaitWithTimeout(
        [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return values_.count(key) != 0; }, timeout);
    if (!found) {
      return absl::DeadlineExceededError(
          absl::StrCat("key \"", key, "\" did not appear within ", absl::FormatDuration(timeout)));
    }
    return values_[key];
  }

  absl::StatusOr<std::string> SetIfAbsent(const std::string& key,
                                          const std::string& value) override {
    internal::MutexLock lock(&mu_);
    return values_.emplace(key, value).first->second;
  }

 private:
  internal::Mutex mu_;
  std::map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::shared_ptr<CoordinationStore> NewInProcessStore() { return std::make_shared<InProcessStore>(); }

}  // namespace ckpt
