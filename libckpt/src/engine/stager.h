// Staging: copying a save's tensors into staging chunks.
#ifndef CKPT_ENGINE_STAGER_H_
#define CKPT_ENGINE_STAGER_H_

#include "absl/status/status.h"
#include "engine/save_job.h"
#include "staging/device_copier.h"
#include "staging/staging_pool.h"

namespace ckpt::internal {

// Copies every tensor of `job` into chunks of `pool`, laid out exactly as
// the shard files will be (records at their planned offsets, zero padding
// between them), and hands each full chunk to the persister at once
// (`job.PushChunk`), so writing starts while copying goes on.
//
// Host tensors are hashed (XXH3-64) in the same pass as the copy, in 64 KiB
// pieces while the bytes are cache-hot. Device tensors are copied by
// `copier` (REQUIRES: not null when the job has any), a few chunks ahead;
// each chunk is hashed from staging memory once its copies have landed and
// only then handed on, so chunks reach the persister in order.
//
// Waits for free chunks when the pool is exhausted (the time is added to
// `job.staging_wait_s`). Stops with kCancelled when the pool is cancelled,
// or kAborted when `job.abort` becomes true (the persister failed). Does not
// call `job.FinishStaging`.
absl::Status StageJob(SaveJob& job, StagingPool& pool, DeviceCopier* copier);

}  // namespace ckpt::internal

#endif  // CKPT_ENGINE_STAGER_H_
