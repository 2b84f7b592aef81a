// Rebuilding a delta engine's reference state from the checkpoints already
// in its root, so that the first save after a restart can be a delta
// (`DeltaOptions::resume_from_newest`, docs/deltas.md "After a restart").
#ifndef CKPT_ENGINE_REFERENCE_REBUILD_H_
#define CKPT_ENGINE_REFERENCE_REBUILD_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "ckpt/file_system.h"
#include "ckpt/options.h"
#include "engine/reference_state.h"

namespace ckpt::internal {

// Reads the newest checkpoint of `root` that verifies (chained deltas), or
// the full checkpoint its chain starts from (differential deltas: they are
// taken against it), into `reference`, tensor by tensor as its budget
// allows, and marks the reference as matching it. Returns the step read, or
// nullopt when `root` has no checkpoint (or only a multi-rank one, whose
// parts a single-process engine does not take deltas against). On error,
// or when `cancelled()` turns true between reads, `reference` is left
// invalid (the next save is full) and the error is returned.
absl::StatusOr<std::optional<int64_t>> RebuildReference(std::shared_ptr<FileSystem> fs,
                                                        const std::string& root,
                                                        const IoOptions& io, bool differential,
                                                        ReferenceState* reference,
                                                        const std::function<bool()>& cancelled);

}  // namespace ckpt::internal

#endif  // CKPT_ENGINE_REFERENCE_REBUILD_H_
