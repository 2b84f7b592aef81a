// dist_ops.h: engines of multi-rank checkpoints on a torch.distributed
// process group (registered in ops.cc).
#ifndef CKPT_TORCH_EXT_DIST_OPS_H_
#define CKPT_TORCH_EXT_DIST_OPS_H_

#include <optional>
#include <string>
#include <tuple>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/custom_class.h>

#include "engine_class.h"

namespace ckpt::torch_ext {

// `OpenEngine` is `torch.ops.ckpt.open_engine`: an engine on `root` with the
// options of `Engine(root, options_json)`, and, when `group` is given and has
// more than one rank, one rank of a multi-rank checkpoint: rank and world
// size from the group, coordination through (a clone of) the group's c10d
// store under `key_prefix` (the same on every rank, unique per root and
// opening), `commit_timeout_s` for the open handshake and each commit
// (ckpt/distributed.h), `shared_root` false for ranks that each open a
// directory of their own (`DistributedOptions::shared_root`). Blocks until
// every rank has opened (rank 0 first) or the timeout passed. A group of one
// rank, or none, opens a single-process engine. ValueError for a timeout that
// is not positive or an empty prefix.
c10::intrusive_ptr<EngineHolder> OpenEngine(const std::string& root, const std::string& options_json,
                                            const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                                            const std::string& key_prefix, double commit_timeout_s,
                                            bool shared_root = true);

// `StoreOp` is `torch.ops.ckpt._store_op`, for tests of the c10d adapter
// (c10d_store.h) against a real store: runs `op` ("set", "get",
// "set_if_absent") on a fresh adapter over `group`'s store and returns
// ("", value) on success, (status code name, message) on failure. It never
// throws for a store error.
std::tuple<std::string, std::string> StoreOp(const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                                             const std::string& op, const std::string& key,
                                             const std::string& value, double timeout_s);

}  // namespace ckpt::torch_ext

#endif  // CKPT_TORCH_EXT_DIST_OPS_H_
