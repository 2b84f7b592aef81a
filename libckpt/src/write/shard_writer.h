// `WriteShards`: streams tensors through a `ChunkPool` into shard files.
#ifndef CKPT_WRITE_SHARD_WRITER_H_
#define CKPT_WRITE_SHARD_WRITER_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "ckpt/file_system.h"
#include "ckpt/tensor.h"
#include "format/shard_plan.h"
#include "io/chunk_pool.h"

namespace ckpt::internal {

// Creates every shard of `plan` in `dir`, copies each tensor into the pool's
// chunks while computing its XXH3-64 (one pass, cache-hot), and writes full
// chunks as they fill, many in flight across files. Records are zero-padded
// to the alignment; each file is then truncated to its real size, fsynced
// and closed. `hashes[i]` receives tensor i's checksum.
// On error the files may be partly written; the caller removes `dir`.
absl::Status WriteShards(FileSystem& fs, IoQueue& queue, bool direct, ChunkPool& pool,
                         const std::string& dir, std::span<const TensorView> tensors,
                         std::span<const PlannedShard> plan, std::vector<uint64_t>* hashes);

}  // namespace ckpt::internal

#endif  // CKPT_WRITE_SHARD_WRITER_H_
