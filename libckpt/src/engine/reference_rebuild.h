// Rebuilding a delta engine's reference state from the checkpoints already
// in its root, so that the first save after a restart can be a delta
// (`DeltaOptions::resume_from_newest`, docs/deltas.md "After a restart").
#ifndef CKPT_ENGINE_REFERENCE_REBUILD_H_
#define CKPT_ENGINE_REFERENCE_REBUILD_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "ckpt/file_system.h"
#include "ckpt/options.h"
#include "engine/reference_state.h"

namespace ckpt::internal {

// What a rebuilt reference was read from.
struct RebuiltFrom {
  int64_t newest_step = -1;  // the checkpoint opened: the newest that verifies
  // The step whose values the reference holds (its next delta's base): the
  // newest (chained), or the full checkpoint its chain starts from
  // (differential).
  int64_t base_step = -1;
  // The checksum of `base_step`'s MANIFEST.json: of a multi-rank checkpoint
  // the step's own, which lists every rank's part, so every rank that
  // rebuilt from the same checkpoint reports the same value.
  uint64_t base_step_xxh3 = 0;
};

// "base step 12 (MANIFEST.json 0123456789abcdef), newest step 14": equal
// texts name the same checkpoints.
std::string RebuiltFromText(const RebuiltFrom& from);

// Reads the newest checkpoint of `root` that verifies (chained deltas), or
// the full checkpoint its chain starts from (differential deltas: they are
// taken against it), into `reference`, tensor by tensor as its budget
// allows, and marks the reference as matching it, with the counters
// (`full_every`, the restore-read bound) a save of every link would have
// left. With `world_size` > 1 only rank `rank`'s part is read, along the
// chain of that rank's parts; the checkpoint must have been written by as
// many ranks; `own_part_only`: each step is what this rank's copy holds
// (ranks that share no ROOT: the manifest and this rank's part), so the
// newest step is the newest whose own part verifies. Returns what was read, or nullopt when there is nothing to
// take deltas against (no checkpoint; one written by another number of
// ranks). On error, or when `cancelled()` turns true between reads,
// `reference` is left invalid (the next save is full) and the error is
// returned.
absl::StatusOr<std::optional<RebuiltFrom>> RebuildReference(
    std::shared_ptr<FileSystem> fs, const std::string& root, const IoOptions& io, bool differential,
    int rank, int world_size, ReferenceState* reference, const std::function<bool()>& cancelled,
    bool own_part_only = false);

}  // namespace ckpt::internal

#endif  // CKPT_ENGINE_REFERENCE_REBUILD_H_
