// Staging: copying a save's tensors into staging chunks.
#ifndef CKPT_ENGINE_STAGER_H_
#define CKPT_ENGINE_STAGER_H_

#include <memory>

#include "absl/status/status.h"
#include "engine/save_job.h"
#include "staging/device_copier.h"
#include "staging/parallel_copier.h"
#include "staging/staging_pool.h"

namespace ckpt::internal {

// One save on its way into the stager, handed over by value: the job, and
// what `SaveAsync` made for it on the caller's thread.
struct StagingRequest {
  std::shared_ptr<SaveJob> job;
  // Copies the job's device tensors; null when it has none.
  DeviceCopier* device = nullptr;
  // The caller's streams as they were at `SaveAsync` (with `device`): every
  // device copy is ordered after them.
  std::unique_ptr<CallerStreamMark> mark;
};

// Copies every tensor of `request.job` into chunks of `pool`, laid out
// exactly as the shard files will be (records at their planned offsets,
// zero padding between them), and hands each full chunk to the persister
// (`job.PushChunk`), in order, so writing can start while copying goes on.
// Nothing is hashed here: the persister hashes what it writes
// (engine/record_hasher.h), off the caller's blocked time.
//
// Host tensors are copied by `host` when it has helper threads: pieces are
// batched (tens of MiB) and each batch's chunks are handed on once it ran;
// null or one thread copies on the calling thread, chunk by chunk. Device
// tensors are copied by `request.device` (REQUIRES: not null when the job
// has any), a few chunks ahead; a chunk is handed on once its copies have
// landed. The stream mark is destroyed once every copy has.
//
// Waits for free chunks when the pool is exhausted (the time is reported as
// `staging_wait_s`). Stops with kCancelled when the pool is cancelled, or
// kAborted when `job.abort` becomes true (the persister failed). Returns the
// outcome and the stager's figures; the caller adds its blocked time and
// hands the report to `job.FinishStaging`.
StagingReport StageJob(StagingRequest request, StagingPool& pool, ParallelCopier* host);

}  // namespace ckpt::internal

#endif  // CKPT_ENGINE_STAGER_H_
