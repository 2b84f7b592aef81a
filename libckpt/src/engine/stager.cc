#include "engine/stager.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "util/hash.h"
#include "util/status_macros.h"

namespace ckpt::internal {
namespace {

// Bytes copied between hash updates: small enough to stay in L2.
constexpr size_t kCopyPiece = 64 * 1024;

class ChunkFiller {
 public:
  ChunkFiller(SaveJob& job, StagingPool& pool) : job_(job), pool_(pool) {}

  void BeginShard(size_t shard) {
    shard_ = shard;
    file_offset_ = 0;
  }

  // Appends `n` bytes of `src` (zeros when null), hashing copied bytes into
  // `hash` when not null.
  absl::Status Append(const char* src, size_t n, Xxh3Stream* hash) {
    while (n > 0) {
      if (current_ == kNone) CKPT_RETURN_IF_ERROR(TakeChunk());
      const size_t take = std::min({n, pool_.chunk_bytes() - fill_, kCopyPiece});
      char* dst = pool_.chunk(current_) + fill_;
      if (src != nullptr) {
        std::memcpy(dst, src, take);
        if (hash != nullptr) hash->Update(dst, take);
        src += take;
      } else {
        std::memset(dst, 0, take);
      }
      fill_ += take;
      n -= take;
      if (fill_ == pool_.chunk_bytes()) Flush();
    }
    return absl::OkStatus();
  }

  void Flush() {
    if (current_ == kNone) return;
    job_.PushChunk(StagedChunk{shard_, file_offset_, current_, fill_});
    file_offset_ += fill_;
    current_ = kNone;
    fill_ = 0;
  }

  // Gives back a chunk still held (after an error).
  void Abandon() {
    if (current_ != kNone) pool_.Release(current_);
    current_ = kNone;
  }

 private:
  static constexpr size_t kNone = ~size_t{0};

  absl::Status TakeChunk() {
    if (job_.abort.load(std::memory_order_relaxed)) {
      return absl::AbortedError("save abandoned: writing it failed");
    }
    std::optional<size_t> chunk = pool_.TryAcquire();
    if (!chunk.has_value()) {
      const Clock::time_point start = Clock::now();
      chunk = pool_.Acquire();
      job_.staging_wait_s += SecondsSince(start);
      if (!chunk.has_value()) return absl::CancelledError("save cancelled: engine closing");
    }
    current_ = *chunk;
    return absl::OkStatus();
  }

  SaveJob& job_;
  StagingPool& pool_;
  size_t shard_ = 0;
  uint64_t file_offset_ = 0;
  size_t current_ = kNone;
  size_t fill_ = 0;
};

}  // namespace

absl::Status StageJob(SaveJob& job, StagingPool& pool) {
  const Clock::time_point start = Clock::now();
  ChunkFiller filler(job, pool);
  Xxh3Stream hash;
  absl::Status status;
  for (size_t s = 0; s < job.plan.size() && status.ok(); ++s) {
    const PlannedShard& shard = job.plan[s];
    filler.BeginShard(s);
    uint64_t position = 0;
    for (const PlannedRecord& record : shard.records) {
      const TensorView& t = job.tensors[record.tensor];
      status = filler.Append(nullptr, record.offset - position, nullptr);
      if (!status.ok()) break;
      hash.Reset();
      status = filler.Append(static_cast<const char*>(t.data), t.nbytes, &hash);
      if (!status.ok()) break;
      job.hashes[record.tensor] = hash.Digest();
      position = record.offset + t.nbytes;
    }
    if (status.ok()) status = filler.Append(nullptr, shard.padded_bytes - position, nullptr);
    if (status.ok()) filler.Flush();
  }
  if (!status.ok()) filler.Abandon();
  job.staging_s = SecondsSince(start);
  return status;
}

}  // namespace ckpt::internal
