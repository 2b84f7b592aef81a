// Staging: copying a save's tensors into staging chunks.
#ifndef CKPT_ENGINE_STAGER_H_
#define CKPT_ENGINE_STAGER_H_

#include <atomic>

#include "absl/status/status.h"
#include "engine/save_job.h"
#include "staging/staging_pool.h"

namespace ckpt::internal {

// Copies every tensor of `job` into chunks of `pool`, laid out exactly as
// the shard files will be (records at their planned offsets, zero padding
// between them), computing each tensor's XXH3-64 in the same pass while the
// bytes are cache-hot. Each full chunk is handed to the persister at once
// (`job.PushChunk`), so writing starts while copying goes on. Waits for free
// chunks when the pool is exhausted (the time is added to
// `job.staging_wait_s`). Stops with kCancelled when the pool is cancelled,
// or kAborted when `job.abort` becomes true (the persister failed).
// Does not call `job.FinishStaging`.
absl::Status StageJob(SaveJob& job, StagingPool& pool);

}  // namespace ckpt::internal

#endif  // CKPT_ENGINE_STAGER_H_
