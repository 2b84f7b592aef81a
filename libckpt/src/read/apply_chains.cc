#include "read/apply_chains.h"

#include <algorithm>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "delta/delta_codec.h"
#include "delta/plane_codec.h"
#include "format/names.h"
#include "io/io_executor.h"
#include "read/decode_record.h"
#include "util/hash.h"
#include "util/log.h"
#include "util/mutex.h"
#include "util/status_macros.h"
#include "util/worker_pool.h"

namespace ckpt::internal {
namespace {

// A tensor with byte-plane links and at least this many blocks per thread
// of the pool is applied by one thread whose links decode their blocks on
// the whole pool; others are applied one tensor per thread.
constexpr uint64_t kSplitBlocksPerThread = 2;

// The arena holds up to kSlots batches: the reader thread fills free slots
// in order while the caller applies full ones, so that the disk and the
// cores both stay busy when batches take unequal times to read and apply.
// A call's links are cut into batches of a kSlots-th of the arena (and, so
// that reading overlaps applying even when everything would fit at once,
// into at least kSlots batches of at least kMinBatchBytes).
constexpr uint64_t kSlots = 4;
constexpr uint64_t kMinBatchBytes = uint64_t{8} << 20;
// The largest arena taken beyond the budget so that a link larger than a
// slot still leaves room for a second batch (see `ChainRun::Plan`).
constexpr uint64_t kMaxTwoSlotArenaBytes = uint64_t{1} << 30;

// One delta link of one target, and where its stored bytes lie in the arena
// (relative to its batch's start).
struct LinkRead {
  size_t target = 0;
  size_t link = 0;
  const TensorInfo* info = nullptr;
  uint64_t at = 0;
};

// Consecutive `LinkRead`s read and applied together.
struct Batch {
  size_t begin = 0, end = 0;  // in the links
  uint64_t bytes = 0;         // arena bytes it takes
  std::vector<size_t> bases;  // targets whose first link it holds: their bases are read first
};

// The links of one target within one batch, applied in order by one thread.
struct Work {
  size_t begin = 0, end = 0;
  bool split = false;  // decode blocks on the pool instead
  absl::Status status;
};

uint64_t SlotBytes(const TensorInfo& t) { return AlignUp(t.stored_bytes, kDirectIoAlignment); }

// One call of `ChainApplier::Apply`.
class ChainRun {
 public:
  ChainRun(ShardFiles& files, std::span<const ChainTarget> targets, uint64_t arena_budget,
           const ChainApplier::ReadBases& read_bases)
      : files_(files),
        targets_(targets),
        read_bases_(read_bases),
        batch_bytes_(arena_budget),
        mismatched_(targets.size(), 0) {}

  // The links in order, cut into batches. kDataLoss for a tensor missing or
  // changing dtype or shape along its chain.
  absl::Status Plan();
  // The bytes of one slot of the arena (the largest batch), and how many
  // slots (1 .. kSlots; fewer where a link larger than a batch makes the
  // slots large).
  uint64_t slot_bytes() const { return slot_bytes_; }
  uint64_t slots() const { return slots_; }
  // Reads and applies every batch through `arena` (`slots()` slots).
  absl::Status Run(char* arena);
  // Targets whose final value did not match (each link's stored bytes did).
  std::vector<size_t> Mismatched() const {
    std::vector<size_t> out;
    for (size_t i = 0; i < mismatched_.size(); ++i) {
      if (mismatched_[i]) out.push_back(i);
    }
    return out;
  }

 private:
  absl::Status StartBatch(IoExecutor& io, const Batch& batch, char* at);
  absl::Status ApplyBatch(const Batch& batch, const char* at, WorkerPool* pool);
  absl::Status ApplyWork(const Work& work, const char* at, WorkerPool* pool);
  const std::string& DirOf(const LinkRead& r) const { return targets_[r.target].chain->link(r.link).dir; }

  ShardFiles& files_;
  const std::span<const ChainTarget> targets_;
  const ChainApplier::ReadBases& read_bases_;
  uint64_t batch_bytes_;  // the arena's budget; then, after `Plan`, a batch's
  uint64_t slot_bytes_ = 0;
  uint64_t slots_ = 1;
  std::vector<LinkRead> links_;
  std::vector<Batch> batches_;
  std::vector<char> mismatched_;  // by target
};

absl::Status ChainRun::Plan() {
  uint64_t total = 0;
  for (const ChainTarget& target : targets_) {
    for (size_t l = target.base + 1; l < target.chain->size(); ++l) {
      const TensorInfo* t = target.chain->Find(l, *target.name);
      if (t != nullptr) total += SlotBytes(*t);
    }
  }
  const uint64_t budget = batch_bytes_;
  batch_bytes_ = std::max<uint64_t>(
      kDirectIoAlignment,
      std::min(AlignDown(budget / kSlots), std::max(kMinBatchBytes, AlignUp(total / kSlots))));
  Batch batch;
  for (size_t i = 0; i < targets_.size(); ++i) {
    const ChainTarget& target = targets_[i];
    CKPT_ASSIGN_OR_RETURN(std::vector<const TensorInfo*> records,
                          DeltaLinksOf(*target.chain, *target.name, target.base));
    for (size_t k = 0; k < records.size(); ++k) {
      const TensorInfo* t = records[k];
      const size_t l = target.base + 1 + k;
      const uint64_t slot = SlotBytes(*t);
      if (batch.end > batch.begin && batch.bytes + slot > batch_bytes_) {
        batches_.push_back(std::move(batch));
        batch = Batch{batches_.back().end, batches_.back().end, 0, {}};
      }
      if (k == 0) batch.bases.push_back(i);
      links_.push_back(LinkRead{i, l, t, batch.bytes});
      batch.bytes += slot;
      ++batch.end;
    }
  }
  if (batch.end > batch.begin) batches_.push_back(std::move(batch));
  for (const Batch& b : batches_) slot_bytes_ = std::max(slot_bytes_, b.bytes);
  slots_ = std::clamp<uint64_t>(budget / std::max<uint64_t>(slot_bytes_, 1), 1, kSlots);
  // Two slots at least, even past the budget, unless the largest link is
  // huge: with one, reading (the bases too) and applying take turns.
  if (slots_ == 1 && 2 * slot_bytes_ <= std::max<uint64_t>(budget, kMaxTwoSlotArenaBytes)) slots_ = 2;
  slots_ = std::min<uint64_t>(slots_, batches_.size());
  return absl::OkStatus();
}

absl::Status ChainRun::Run(char* arena) {
  WorkerPool* const pool = files_.codec_pool();  // (created here, before the reads start)
  const IoOptions& options = files_.io();
  // Pieces large enough that a batch of large links fills the queue in few.
  const uint64_t piece = std::min<uint64_t>(
      std::max<uint64_t>(options.chunk_bytes,
                         AlignUp(batch_bytes_ / std::max<size_t>(options.queue_depth, 1))),
      uint64_t{64} << 20);
  auto slot = [&](size_t b) { return arena + (b % slots_) * slot_bytes_; };
  // With one slot, read and apply in turn; else batches are read on a
  // thread of their own (the only one driving `io` while it runs), into
  // slots the caller has finished applying. Neither waits on itself: the
  // reader waits for the caller to apply (or stop), the caller for a read to
  // finish (or fail).
  auto read = [&](size_t b) {
    // The bases first (through the queue, by the caller's reads), then the
    // links, each batch on an executor of its own: one drives the queue at a time.
    if (read_bases_ && !batches_[b].bases.empty()) CKPT_RETURN_IF_ERROR(read_bases_(batches_[b].bases));
    IoExecutor io(files_.queue(), piece);
    absl::Status status = StartBatch(io, batches_[b], slot(b));
    absl::Status drained = io.Drain();
    return status.ok() ? drained : status;
  };
  if (slots_ == 1) {
    for (size_t b = 0; b < batches_.size(); ++b) {
      CKPT_RETURN_IF_ERROR(read(b));
      CKPT_RETURN_IF_ERROR(ApplyBatch(batches_[b], slot(b), pool));
    }
    return absl::OkStatus();
  }
  Mutex mu;
  size_t read_done = 0, applied = 0;  // batches, in order
  bool stop = false;                  // the caller gives up
  absl::Status read_status;           // the reader's first error
  std::thread reader([&] {
    for (size_t b = 0; b < batches_.size(); ++b) {
      {
        MutexLock lock(&mu);
        mu.Await([&] { return stop || b < applied + slots_; });
        if (stop) return;
      }
      absl::Status s = read(b);
      MutexLock lock(&mu);
      if (!s.ok()) {
        read_status = std::move(s);
        return;
      }
      read_done = b + 1;
    }
  });
  absl::Status status;
  for (size_t b = 0; b < batches_.size() && status.ok(); ++b) {
    {
      MutexLock lock(&mu);
      mu.Await([&] { return read_done > b || !read_status.ok(); });
      if (read_done <= b) break;
    }
    status = ApplyBatch(batches_[b], slot(b), pool);
    MutexLock lock(&mu);
    applied = b + 1;
    stop = !status.ok();
  }
  {
    MutexLock lock(&mu);
    stop = true;  // (the reader may still wait for a slot after an error)
  }
  reader.join();  // (every read has finished: the arena may be reused)
  return status.ok() ? read_status : status;
}

absl::Status ChainRun::StartBatch(IoExecutor& io, const Batch& batch, char* at) {
  for (size_t r = batch.begin; r < batch.end; ++r) {
    const LinkRead& read = links_[r];
    const TensorInfo& t = *read.info;
    if (t.stored_bytes == 0) continue;
    CKPT_ASSIGN_OR_RETURN(File * file, files_.Get(DirOf(read), t.shard));
    const uint64_t length = file->direct() ? SlotBytes(t) : t.stored_bytes;
    files_.CountRead(length);
    CKPT_RETURN_IF_ERROR(io.Start(IoOp::Kind::kRead, file, t.offset, at + read.at, length, r, -1,
                                  t.stored_bytes));
  }
  return absl::OkStatus();
}

absl::Status ChainRun::ApplyBatch(const Batch& batch, const char* at, WorkerPool* pool) {
  std::vector<Work> work;
  for (size_t r = batch.begin; r < batch.end;) {
    Work w;
    w.begin = w.end = r;
    bool planes = false;
    while (w.end < batch.end && links_[w.end].target == links_[r].target) {
      planes |= links_[w.end].info->encoding == RecordEncoding::kXorPlanes;
      ++w.end;
    }
    w.split = planes && links_[r].info->raw_bytes >= kSplitBlocksPerThread * kPlaneBlockBytes * pool->threads();
    work.push_back(std::move(w));
    r = work.back().end;
  }
  // Large tensors one at a time, each link's blocks on the whole pool; then
  // the rest, one tensor per thread.
  for (Work& w : work) {
    if (w.split) w.status = ApplyWork(w, at, pool);
  }
  std::vector<size_t> rest;
  for (size_t i = 0; i < work.size(); ++i) {
    if (!work[i].split) rest.push_back(i);
  }
  pool->ParallelFor(rest.size(), [&](size_t i) {
    Work& w = work[rest[i]];
    w.status = ApplyWork(w, at, nullptr);
  });
  for (const Work& w : work) CKPT_RETURN_IF_ERROR(w.status);
  return absl::OkStatus();
}

absl::Status ChainRun::ApplyWork(const Work& work, const char* at, WorkerPool* pool) {
  const size_t target = links_[work.begin].target;
  const ChainTarget& c = targets_[target];
  const TensorInfo* last = nullptr;
  for (size_t r = work.begin; r < work.end; ++r) {
    const LinkRead& read = links_[r];
    const TensorInfo& t = *read.info;
    const std::string& dir = DirOf(read);
    const char* payload = at + read.at;
    CKPT_RETURN_IF_ERROR(CheckStoredBytes(dir, t, payload));
    absl::Status applied = ApplyDelta(t.encoding, payload, t.stored_bytes, c.dst, t.raw_bytes, t.dtype, pool);
    if (!applied.ok()) {
      return absl::DataLossError(absl::StrCat("tensor \"", t.name, "\" in shard ", JoinPath(dir, t.shard),
                                              " at offset ", t.offset, ": ", applied.message()));
    }
    // A link without a stored checksum (an older writer's) is checked by
    // the value it yields, as it always was.
    if (!t.stored_xxh3.has_value()) {
      const uint64_t actual = Xxh3(c.dst, t.raw_bytes);
      if (actual != t.xxh3) return ChecksumMismatch(dir, t, actual);
    }
    last = &t;
  }
  // The reconstructed value, once, when this was the opened link.
  if (links_[work.end - 1].link + 1 == c.chain->size() && last->stored_xxh3.has_value() &&
      Xxh3(c.dst, last->raw_bytes) != last->xxh3) {
    mismatched_[target] = 1;
  }
  return absl::OkStatus();
}

}  // namespace

ChainApplier::ChainApplier(const IoOptions& io)
    : arena_budget_(2 * std::max<uint64_t>(io.buffer_bytes, kDirectIoAlignment)) {}

absl::Status ChainApplier::Apply(ShardFiles& files, std::span<const ChainTarget> targets,
                                 const ReadBases& read_bases) {
  if (targets.empty()) return absl::OkStatus();
  ChainRun run(files, targets, arena_budget_, read_bases);
  CKPT_RETURN_IF_ERROR(run.Plan());
  CKPT_ASSIGN_OR_RETURN(char* arena, arena_.Get(run.slot_bytes() * run.slots()));
  CKPT_RETURN_IF_ERROR(run.Run(arena));
  // Every link's stored bytes matched, yet the value does not: rebuild it
  // link by link, checking the value after each, to name the link at fault.
  for (size_t i : run.Mismatched()) {
    const ChainTarget& c = targets[i];
    const TensorInfo* opened = c.chain->Find(c.chain->size() - 1, *c.name);
    Log(LogLevel::kWarning, absl::StrCat("tensor \"", *c.name, "\" of ", c.chain->opened().dir,
                                         " does not match its checksum ", HashToHex(opened->xxh3),
                                         " after its delta chain; re-checking link by link"));
    if (!read_bases) {
      return absl::DataLossError(absl::StrCat("tensor \"", *c.name, "\" of ", c.chain->opened().dir,
                                              " does not match its checksum after its delta chain"));
    }
    CKPT_RETURN_IF_ERROR(read_bases({&i, 1}));
    CKPT_RETURN_IF_ERROR(ApplyDeltas(files, *c.chain, *c.name, c.base, c.dst));
  }
  return absl::OkStatus();
}

}  // namespace ckpt::internal
