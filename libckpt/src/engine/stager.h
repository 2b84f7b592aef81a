// Staging: copying a save's tensors into staging chunks.
#ifndef CKPT_ENGINE_STAGER_H_
#define CKPT_ENGINE_STAGER_H_

#include "absl/status/status.h"
#include "engine/save_job.h"
#include "staging/device_copier.h"
#include "staging/parallel_copier.h"
#include "staging/staging_pool.h"

namespace ckpt::internal {

// Copies every tensor of `job` into chunks of `pool`, laid out exactly as
// the shard files will be (records at their planned offsets, zero padding
// between them), and hands each full chunk to the persister
// (`job.PushChunk`), in order, so writing can start while copying goes on.
// Nothing is hashed here: the persister hashes what it writes
// (engine/record_hasher.h), off the caller's blocked time.
//
// Host tensors are copied by `host` when it has helper threads: pieces are
// batched (tens of MiB) and each batch's chunks are handed on once it ran;
// null or one thread copies on the calling thread, chunk by chunk. Device
// tensors are copied by `device` (REQUIRES: not null when the job has any),
// a few chunks ahead; a chunk is handed on once its copies have landed.
//
// Waits for free chunks when the pool is exhausted (the time is added to
// `job.staging_wait_s`). Stops with kCancelled when the pool is cancelled,
// or kAborted when `job.abort` becomes true (the persister failed). Does not
// call `job.FinishStaging`.
absl::Status StageJob(SaveJob& job, StagingPool& pool, DeviceCopier* device,
                      ParallelCopier* host);

}  // namespace ckpt::internal

#endif  // CKPT_ENGINE_STAGER_H_
