// Verifying a full checkpoint by streaming every record through a reader's
// chunks: the bytes are hashed and dropped, never kept.
#ifndef CKPT_READ_VERIFY_FULL_H_
#define CKPT_READ_VERIFY_FULL_H_

#include <string>

#include "absl/status/status.h"
#include "ckpt/reader.h"
#include "format/manifest.h"
#include "read/read_chunks.h"
#include "read/shard_files.h"

namespace ckpt::internal {

// Reads every record of the full checkpoint `dir` (described by `manifest`)
// and checks each against its XXH3: zstd records one at a time, the others
// as one stream of chunk-sized reads, up to all of `chunks` in flight.
// Returns the first mismatch (kDataLoss naming the shard) or I/O error,
// after every transfer has finished; every chunk is free again. `progress`
// (may be null) is told the bytes of each piece once it is hashed, and of
// each compressed or empty tensor once it is checked.
// REQUIRES: `manifest` is not a delta (its records hold whole tensors).
absl::Status VerifyFullCheckpoint(ShardFiles& files, ReadChunks& chunks, const std::string& dir,
                                  const Manifest& manifest, const VerifyProgress& progress);

}  // namespace ckpt::internal

#endif  // CKPT_READ_VERIFY_FULL_H_
