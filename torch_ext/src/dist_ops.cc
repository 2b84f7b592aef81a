#include "dist_ops.h"

#include <cmath>
#include <memory>
#include <utility>

#include <c10/util/Exception.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "c10d_store.h"
#include "ckpt/distributed.h"

namespace ckpt::torch_ext {
namespace {

absl::Duration Seconds(double s) {
  return std::isinf(s) ? absl::InfiniteDuration() : absl::Seconds(s);
}

}  // namespace

c10::intrusive_ptr<EngineHolder> OpenEngine(const std::string& root, const std::string& options_json,
                                            const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                                            const std::string& key_prefix, double commit_timeout_s,
                                            bool shared_root) {
  EngineOptions options = ParseEngineOptions(options_json);
  if (group && group->getSize() > 1) {
    TORCH_CHECK_VALUE(commit_timeout_s > 0 && !std::isnan(commit_timeout_s),
                      "ckpt: commit_timeout_s must be positive, got ", commit_timeout_s);
    TORCH_CHECK_VALUE(!key_prefix.empty(), "ckpt: the key prefix of a multi-rank engine is empty");
    c10::intrusive_ptr<c10d::Store> store = group->getStore();
    TORCH_CHECK_VALUE(store, "ckpt: the process group has no c10d store to coordinate through");
    DistributedOptions& d = options.distributed;
    d.rank = group->getRank();
    d.world_size = group->getSize();
    d.store = NewC10dStore(store);
    d.key_prefix = key_prefix;
    d.commit_timeout = Seconds(commit_timeout_s);
    d.shared_root = shared_root;
  }
  return c10::make_intrusive<EngineHolder>(root, options);
}

std::tuple<std::string, std::string> StoreOp(const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                                             const std::string& op, const std::string& key,
                                             const std::string& value, double timeout_s) {
  TORCH_CHECK_VALUE(group, "ckpt: _store_op needs a process group");
  std::shared_ptr<CoordinationStore> store = NewC10dStore(group->getStore());
  absl::StatusOr<std::string> out;
  if (op == "set") {
    absl::Status s = store->Set(key, value);
    out = s.ok() ? absl::StatusOr<std::string>("") : absl::StatusOr<std::string>(s);
  } else if (op == "get") {
    out = store->Get(key, Seconds(timeout_s));
  } else if (op == "set_if_absent") {
    out = store->SetIfAbsent(key, value);
  } else {
    TORCH_CHECK_VALUE(false, "ckpt: _store_op: unknown op \"", op, "\"");
  }
  if (out.ok()) return {"", std::move(*out)};
  return {absl::StatusCodeToString(out.status().code()), std::string(out.status().message())};
}

}  // namespace ckpt::torch_ext
