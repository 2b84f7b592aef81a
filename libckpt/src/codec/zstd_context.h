// This thread's zstd contexts: every codec that compresses or decompresses
// on a thread shares one compression and one decompression context, created
// on the thread's first use and freed when it exits (so a worker pool holds
// one pair per worker, never one per call).
#ifndef CKPT_CODEC_ZSTD_CONTEXT_H_
#define CKPT_CODEC_ZSTD_CONTEXT_H_

#include <zstd.h>

namespace ckpt::internal {

// The calling thread's compression context. Its parameters are whatever its
// last user on this thread set: a caller that relies on any advanced
// parameter resets it first (`ZSTD_CCtx_reset(cctx,
// ZSTD_reset_session_and_parameters)`) and sets what it needs;
// `ZSTD_compressCCtx` ignores them. Null only if zstd could not allocate it.
ZSTD_CCtx* ThreadZstdCCtx();

// The calling thread's decompression context (no parameter is ever set on
// it). Null only if zstd could not allocate it.
ZSTD_DCtx* ThreadZstdDCtx();

}  // namespace ckpt::internal

#endif  // CKPT_CODEC_ZSTD_CONTEXT_H_
