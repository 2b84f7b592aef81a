#include "engine/stager.h"

#include <algorithm>
#include <cstring>
#include <deque>

#include "absl/strings/str_cat.h"
#include "util/status_macros.h"

namespace ckpt::internal {
namespace {

// Host bytes copied per piece: big enough that claiming a piece costs
// nothing, small enough to share a batch out evenly.
constexpr size_t kCopyPiece = 512 * 1024;
// Host copies are batched up to this many bytes before the copier runs them
// (when it has helper threads): a batch's chunks are handed on once it ran.
constexpr size_t kBatchBytes = 32 << 20;
// Bytes of device copies allowed in flight before the oldest chunk is
// awaited: enough that the copier merges pieces into large copies (see
// cuda/cuda_copier.cc) and the copy engine never idles while the stager
// waits, small enough that the persister gets chunks early.
constexpr size_t kDeviceBytesAhead = size_t{256} << 20;

// A full (or flushed) chunk waiting for its copies before it is handed on.
struct PendingChunk {
  StagedChunk chunk;
  uint64_t batch = 0;          // host copies: ready once `batches_run_ >= batch`
  bool device = false;         // device copies: ready once `token` has landed
  uint64_t token = 0;
};

class ChunkFiller {
 public:
  ChunkFiller(SaveJob& job, StagingPool& pool, DeviceCopier* device, const CallerStreamMark* mark,
              ParallelCopier* host)
      : job_(job), pool_(pool), device_(device), mark_(mark), host_(host) {}

  // Time spent waiting for free chunks.
  double wait_s() const { return wait_s_; }

  void BeginShard(size_t shard) {
    shard_ = shard;
    file_offset_ = 0;
  }

  absl::Status Zeros(size_t n) { return Fill(nullptr, n); }

  // Copies all of tensor `index` into the stream.
  absl::Status Tensor(size_t index) { return Fill(&job_.tensors[index], job_.tensors[index].nbytes); }

  // Hands the partly filled chunk on, or queues it behind its copies.
  absl::Status Flush() {
    if (current_ == kNone) return absl::OkStatus();
    PendingChunk pending{StagedChunk{shard_, file_offset_, current_, fill_}, 0, current_device_, 0};
    if (current_host_) pending.batch = batches_run_ + 1;
    file_offset_ += fill_;
    current_ = kNone;
    fill_ = 0;
    current_device_ = false;
    current_host_ = false;
    if (pending.device) {
      CKPT_ASSIGN_OR_RETURN(pending.token, device_->Record());
      ++device_pending_;
    }
    pending_.push_back(pending);
    if (batch_bytes_ >= kBatchBytes) RunBatch();
    return Advance(/*all=*/false);
  }

  // Hands on queued chunks, in order: every one when `all`, otherwise those
  // ready without waiting, and device chunks while more than a few are ahead.
  absl::Status Advance(bool all) {
    while (!pending_.empty()) {
      PendingChunk& p = pending_.front();
      if (p.batch > batches_run_) {
        if (!all) break;
        RunBatch();
      }
      if (p.device) {
        if (!all && device_pending_ <= device_chunks_ahead_) break;
        CKPT_RETURN_IF_ERROR(device_->WaitFor(p.token));
        --device_pending_;
      }
      job_.PushChunk(p.chunk);
      pending_.pop_front();
    }
    return absl::OkStatus();
  }

  // Gives back every chunk still held (after an error). Device copies into
  // them are waited for first, so no copy lands in a reused chunk; host
  // batches run synchronously, so none is in flight.
  void Abandon() {
    if (device_ != nullptr && (device_pending_ > 0 || current_device_)) {
      auto token = device_->Record();
      if (token.ok()) (void)device_->WaitFor(*token);
    }
    batch_.clear();
    batch_bytes_ = 0;
    for (const PendingChunk& p : pending_) pool_.Release(p.chunk.chunk);
    pending_.clear();
    device_pending_ = 0;
    if (current_ != kNone) pool_.Release(current_);
    current_ = kNone;
  }

 private:
  static constexpr size_t kNone = ~size_t{0};

  // Appends `n` bytes of tensor `t` (zeros when null).
  absl::Status Fill(const TensorView* t, size_t n) {
    const char* src = t != nullptr ? static_cast<const char*>(t->data) : nullptr;
    while (n > 0) {
      if (current_ == kNone) CKPT_RETURN_IF_ERROR(TakeChunk());
      const size_t take = std::min({n, pool_.chunk_bytes() - fill_, kCopyPiece});
      char* dst = pool_.chunk(current_) + fill_;
      if (src == nullptr) {
        std::memset(dst, 0, take);
      } else if (t->device == TensorView::Device::kCpu) {
        if (host_ != nullptr) {
          batch_.push_back(CopyPiece{dst, src, take});
          batch_bytes_ += take;
          current_host_ = true;
        } else {
          std::memcpy(dst, src, take);
        }
      } else {
        CKPT_RETURN_IF_ERROR(
            device_->CopyAsync(dst, src, take, t->device_index, t->stream, mark_));
        current_device_ = true;
      }
      if (src != nullptr) src += take;
      fill_ += take;
      n -= take;
      if (fill_ == pool_.chunk_bytes()) CKPT_RETURN_IF_ERROR(Flush());
    }
    return absl::OkStatus();
  }

  void RunBatch() {
    if (!batch_.empty()) host_->Run(batch_);
    batch_.clear();
    batch_bytes_ = 0;
    ++batches_run_;
  }

  absl::Status TakeChunk() {
    if (job_.abort.load(std::memory_order_relaxed)) return AbortReason();
    std::optional<size_t> chunk = pool_.TryAcquire();
    if (!chunk.has_value()) {
      // Queued chunks are completed and handed on meanwhile: the persister
      // frees chunks only once it has written them.
      CKPT_RETURN_IF_ERROR(Advance(/*all=*/true));
      job_.WakePersister();
      const Clock::time_point start = Clock::now();
      chunk = pool_.Acquire(&job_.abort);
      wait_s_ += SecondsSince(start);
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
  DeviceCopier* const device_;
  const CallerStreamMark* const mark_;
  ParallelCopier* const host_;
  const size_t device_chunks_ahead_ =
      std::max<size_t>(4, kDeviceBytesAhead / pool_.chunk_bytes());
  double wait_s_ = 0;
  size_t shard_ = 0;
  uint64_t file_offset_ = 0;
  size_t current_ = kNone;
  size_t fill_ = 0;
  bool current_device_ = false;  // the current chunk has device copies
  bool current_host_ = false;    // the current chunk has copies in `batch_`
  std::vector<CopyPiece> batch_;
  size_t batch_bytes_ = 0;
  uint64_t batches_run_ = 0;
  size_t device_pending_ = 0;  // entries of `pending_` with device copies
  std::deque<PendingChunk> pending_;
};

}  // namespace

StagingReport StageJob(StagingRequest request, StagingPool& pool, ParallelCopier* host) {
  const Clock::time_point start = Clock::now();
  SaveJob& job = *request.job;
  SaveStage queued = SaveStage::kQueued;
  job.stage.compare_exchange_strong(queued, SaveStage::kStaging);
  if (host != nullptr && host->threads() <= 1) host = nullptr;
  ChunkFiller filler(job, pool, request.device, request.mark.get(), host);
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
  if (status.ok()) status = filler.Advance(/*all=*/true);
  if (!status.ok()) filler.Abandon();
  request.mark.reset();  // every copy that used it was queued (and has landed)
  StagingReport report;
  report.status = std::move(status);
  report.staging_s = SecondsSince(start);
  report.staging_wait_s = filler.wait_s();
  report.staging_memory = PinKindName(pool.pin_kind());
  return report;
}

}  // namespace ckpt::internal
