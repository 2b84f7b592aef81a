#include "engine/stager.h"

#include <cstring>
#include <deque>

#include "absl/strings/str_cat.h"
#include "util/hash.h"
#include "util/status_macros.h"

namespace ckpt::internal {
namespace {

// Bytes copied between hash updates: small enough to stay in L2.
constexpr size_t kCopyPiece = 64 * 1024;
// Chunks of device copies allowed in flight before the oldest is awaited.
constexpr size_t kDeviceChunksAhead = 4;

// Part of a device tensor copied into a chunk, hashed once it has landed.
struct DeviceSegment {
  size_t tensor = 0;
  const char* data = nullptr;  // in staging memory
  size_t bytes = 0;
  bool first = false;  // starts the tensor
  bool last = false;   // ends the tensor
};

struct PendingChunk {
  StagedChunk chunk;
  std::vector<DeviceSegment> segments;
  uint64_t token = 0;
};

class ChunkFiller {
 public:
  ChunkFiller(SaveJob& job, StagingPool& pool, DeviceCopier* copier)
      : job_(job), pool_(pool), copier_(copier) {}

  void BeginShard(size_t shard) {
    shard_ = shard;
    file_offset_ = 0;
  }

  absl::Status Zeros(size_t n) { return Fill(nullptr, 0, n, nullptr); }

  // Copies all of tensor `index` into the stream.
  absl::Status Tensor(size_t index) {
    const TensorView& t = job_.tensors[index];
    if (t.nbytes == 0) {
      job_.hashes[index] = Xxh3(nullptr, 0);
      return absl::OkStatus();
    }
    if (t.device == TensorView::Device::kCpu) {
      hash_.Reset();
      CKPT_RETURN_IF_ERROR(Fill(&t, index, t.nbytes, &hash_));
      job_.hashes[index] = hash_.Digest();
      return absl::OkStatus();
    }
    return Fill(&t, index, t.nbytes, nullptr);
  }

  // Hands the partly filled chunk on (or queues it behind device copies).
  absl::Status Flush() {
    if (current_ == kNone) return absl::OkStatus();
    PendingChunk pending{StagedChunk{shard_, file_offset_, current_, fill_}, std::move(segments_), 0};
    segments_.clear();
    file_offset_ += fill_;
    current_ = kNone;
    fill_ = 0;
    if (!pending.segments.empty()) {
      CKPT_ASSIGN_OR_RETURN(pending.token, copier_->Record());
    }
    if (pending.segments.empty() && pending_.empty()) {
      job_.PushChunk(pending.chunk);
      return absl::OkStatus();
    }
    pending_.push_back(std::move(pending));
    return DrainPending(kDeviceChunksAhead);
  }

  // Hands on queued chunks until at most `keep` remain.
  absl::Status DrainPending(size_t keep) {
    while (pending_.size() > keep) {
      PendingChunk& p = pending_.front();
      if (!p.segments.empty()) {
        CKPT_RETURN_IF_ERROR(copier_->WaitFor(p.token));
        for (const DeviceSegment& s : p.segments) {
          if (s.first) device_hash_.Reset();
          device_hash_.Update(s.data, s.bytes);
          if (s.last) job_.hashes[s.tensor] = device_hash_.Digest();
        }
      }
      job_.PushChunk(p.chunk);
      pending_.pop_front();
    }
    return absl::OkStatus();
  }

  // Gives back every chunk still held (after an error). Device copies into
  // them are waited for first, so no copy lands in a reused chunk.
  void Abandon() {
    if (copier_ != nullptr && (!pending_.empty() || !segments_.empty())) {
      auto token = copier_->Record();
      if (token.ok()) (void)copier_->WaitFor(*token);
    }
    for (const PendingChunk& p : pending_) pool_.Release(p.chunk.chunk);
    pending_.clear();
    if (current_ != kNone) pool_.Release(current_);
    current_ = kNone;
  }

 private:
  static constexpr size_t kNone = ~size_t{0};

  // Appends `n` bytes of tensor `t` (zeros when null).
  absl::Status Fill(const TensorView* t, size_t index, size_t n, Xxh3Stream* hash) {
    const char* src = t != nullptr ? static_cast<const char*>(t->data) : nullptr;
    const size_t total = n;
    while (n > 0) {
      if (current_ == kNone) CKPT_RETURN_IF_ERROR(TakeChunk());
      const size_t take = std::min({n, pool_.chunk_bytes() - fill_, kCopyPiece});
      char* dst = pool_.chunk(current_) + fill_;
      if (src == nullptr) {
        std::memset(dst, 0, take);
      } else if (t->device == TensorView::Device::kCpu) {
        std::memcpy(dst, src, take);
        hash->Update(dst, take);
      } else {
        CKPT_RETURN_IF_ERROR(copier_->CopyAsync(dst, src, take, t->device_index, t->stream,
                                                job_.stream_mark.get()));
        const size_t done = total - n;
        segments_.push_back(DeviceSegment{index, dst, take, done == 0, done + take == total});
      }
      if (src != nullptr) src += take;
      fill_ += take;
      n -= take;
      if (fill_ == pool_.chunk_bytes()) CKPT_RETURN_IF_ERROR(Flush());
    }
    return absl::OkStatus();
  }

  absl::Status TakeChunk() {
    if (job_.abort.load(std::memory_order_relaxed)) return AbortReason();
    std::optional<size_t> chunk = pool_.TryAcquire();
    if (!chunk.has_value()) {
      // Chunks queued behind device copies can be handed on meanwhile.
      CKPT_RETURN_IF_ERROR(DrainPending(0));
      job_.WakePersister();  // it frees chunks only once it writes the ones it has
      const Clock::time_point start = Clock::now();
      chunk = pool_.Acquire(&job_.abort);
      job_.staging_wait_s += SecondsSince(start);
      if (!chunk.has_value()) {
        if (job_.abort) return AbortReason();
        return absl::CancelledError("save cancelled: engine closing");
      }
    }
    current_ = *chunk;
    return absl::OkStatus();
  }

  absl::Status AbortReason() const {
    absl::Status reason = job_.abort_reason();
    return reason.ok() ? absl::AbortedError("save abandoned") : reason;
  }

  SaveJob& job_;
  StagingPool& pool_;
  DeviceCopier* const copier_;
  Xxh3Stream hash_;
  Xxh3Stream device_hash_;
  size_t shard_ = 0;
  uint64_t file_offset_ = 0;
  size_t current_ = kNone;
  size_t fill_ = 0;
  std::vector<DeviceSegment> segments_;  // of the current chunk
  std::deque<PendingChunk> pending_;
};

}  // namespace

absl::Status StageJob(SaveJob& job, StagingPool& pool, DeviceCopier* copier) {
  const Clock::time_point start = Clock::now();
  SaveStage queued = SaveStage::kQueued;
  job.stage.compare_exchange_strong(queued, SaveStage::kStaging);
  ChunkFiller filler(job, pool, copier);
  absl::Status status;
  for (size_t s = 0; s < job.plan.size() && status.ok(); ++s) {
    const PlannedShard& shard = job.plan[s];
    filler.BeginShard(s);
    uint64_t position = 0;
    for (const PlannedRecord& record : shard.records) {
      status = filler.Zeros(record.offset - position);
      if (status.ok()) status = filler.Tensor(record.tensor);
      if (!status.ok()) break;
      position = record.offset + record.bytes;
    }
    if (status.ok()) status = filler.Zeros(shard.padded_bytes - position);
    if (status.ok()) status = filler.Flush();
  }
  if (status.ok()) status = filler.DrainPending(0);
  if (!status.ok()) filler.Abandon();
  job.stream_mark.reset();  // every copy that used it was queued (and has landed)
  job.staging_s = SecondsSince(start);
  return status;
}

}  // namespace ckpt::internal
