// `RecordHasher`: the XXH3-64 of every tensor of a save, computed from its
// staged chunks on the persister.
#ifndef CKPT_ENGINE_RECORD_HASHER_H_
#define CKPT_ENGINE_RECORD_HASHER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "engine/save_job.h"
#include "format/shard_plan.h"
#include "util/hash.h"

namespace ckpt::internal {

// Hashing where the bytes are written rather than where they are copied
// keeps it off the caller's blocked time (an eager save's caller waits for
// the copy only), and the hash covers exactly the bytes that reach the file.
//
// Chunks of one shard must arrive in file order with no gap, as the stager
// hands them on; shards may interleave. Zero padding between records is
// skipped.
class RecordHasher {
 public:
  // Writes the hash of tensor `r.tensor` of every record of `plan` into
  // `hashes` (REQUIRES: sized for every tensor; outlives this). For each
  // tensor `t` with `block_bytes[t] > 0` (may be empty: none), also the hash
  // of every `block_bytes[t]` of its record into `block_hashes[t]`, in the
  // same pass over the bytes.
  RecordHasher(const std::vector<PlannedShard>& plan, std::vector<uint64_t>& hashes,
               const std::vector<uint64_t>& block_bytes = {},
               std::vector<std::vector<uint64_t>>* block_hashes = nullptr);
  ~RecordHasher();

  // Hashes the record bytes in chunk `c`, whose staged bytes are `data`.
  // INTERNAL when `c` is not the next chunk of its shard.
  absl::Status Consume(const StagedChunk& c, const char* data);

  // INTERNAL naming the first tensor whose bytes were not all seen.
  absl::Status Finish();

 private:
  struct Cursor {
    uint64_t next_offset = 0;  // where the next chunk of the shard starts
    size_t record = 0;         // the first record not yet hashed
    std::unique_ptr<Xxh3Stream> open;  // while `record` is partly hashed
    std::unique_ptr<Xxh3Stream> block;  // its current block, if it has blocks
    uint64_t block_filled = 0;          // bytes of the current block seen
  };
  uint64_t BlockBytesOf(size_t tensor) const {
    return tensor < block_bytes_.size() ? block_bytes_[tensor] : 0;
  }
  // Feeds `n` bytes of record `r`'s to its block hashes.
  void UpdateBlocks(const PlannedRecord& r, Cursor& cursor, const char* data, uint64_t n);
  // Hashes every empty record at the cursor (they need no bytes).
  void SkipEmpty(size_t shard, Cursor& cursor);

  const std::vector<PlannedShard>& plan_;
  std::vector<uint64_t>& hashes_;
  const std::vector<uint64_t>& block_bytes_;
  std::vector<std::vector<uint64_t>>* const block_hashes_;
  std::vector<Cursor> cursors_;
};

}  // namespace ckpt::internal

#endif  // CKPT_ENGINE_RECORD_HASHER_H_
