#include "read/read_raw_records.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "io/io_executor.h"
#include "io/posix_file.h"
#include "read/decode_record.h"
#include "util/hash.h"
#include "util/mutex.h"
#include "util/status_macros.h"
#include "ckpt/file_system.h"

namespace ckpt::internal {
namespace {

// File offsets and lengths of O_DIRECT transfers.
constexpr uint64_t kAlign = kDirectIoAlignment;
// Records larger than this are read in place in transfers of
// `kLargeTransferBytes` (fewer submissions per byte; fio's 4M blocks).
constexpr uint64_t kLargeRecordBytes = uint64_t{16} << 20;
constexpr uint64_t kLargeTransferBytes = uint64_t{4} << 20;
// A record's final part this small is copied and hashed on the I/O thread:
// waking a worker would cost more than the work.
constexpr uint64_t kLandInlineBytes = uint64_t{64} << 10;

bool IsAlignedTo(const void* p, size_t alignment) {
  return reinterpret_cast<uintptr_t>(p) % alignment == 0;
}

// One call of `ReadRawRecords`. The calling thread only submits transfers
// and reaps them; each part that lands goes to a worker (`ReadChunks::
// workers`), which copies it out of its chunk, if any, and feeds it to its
// record's streamed checksum -- in record order, holding back parts that
// land early -- so a record is verified as its last bytes arrive, not in a
// pass of its own after them.
class RawRecordReads {
 public:
  RawRecordReads(ShardFiles& files, ReadChunks& chunks, std::span<const RecordTarget> records)
      : files_(files), chunks_(chunks), records_(records), checks_(records.size()) {}

  absl::Status Run();

 private:
  // One transfer: bytes [start, start + bytes) of a record, read straight
  // into the caller's memory or into `chunk` and copied there on landing.
  struct Part {
    size_t record = 0;
    uint64_t start = 0;
    uint64_t bytes = 0;
    size_t chunk = SIZE_MAX;
  };
  // A record's checksum as its parts land, in any order: `landed` parts
  // wait until the bytes before them are hashed. One thread at a time
  // (`feeding`) hashes; it alone touches `stream`.
  struct Check {
    uint64_t hashed = 0;
    bool feeding = false;
    std::map<uint64_t, uint64_t> landed;  // start -> bytes
    std::unique_ptr<Xxh3Stream> stream;
  };

  // Starts every part of record `r` (not empty) from `file`.
  absl::Status StartRecord(IoExecutor& io, size_t r, File* file);
  absl::Status StartPart(IoExecutor& io, File* file, Part part, void* buf, size_t length,
                         int buf_index);
  // A free chunk, waiting for transfers or copies to finish if none is.
  absl::Status TakeChunk(IoExecutor& io, size_t* chunk);
  // Hands on whatever transfer finished; with `block`, waits for one first.
  absl::Status Poll(IoExecutor& io, bool block);
  // The transfer of part `tag` is over. Its bytes are landed (on a worker,
  // or here when small) if it `transferred` them and nothing failed yet;
  // otherwise only its chunk is freed.
  void Finished(uint64_t tag, bool transferred);
  void Land(const Part& part);
  // Copies `part` (through a chunk) into place and frees its chunk.
  void CopyOut(const Part& part);
  // Bytes [start, start + bytes) of record `r` are in place: hashes what
  // is now contiguous, and checks the record once all of it is.
  void Feed(size_t r, uint64_t start, uint64_t bytes);
  void Verify(size_t r, uint64_t actual);
  void RecordError(absl::Status status);
  bool failed() const { return failed_.load(std::memory_order_acquire); }

  ShardFiles& files_;
  ReadChunks& chunks_;
  const std::span<const RecordTarget> records_;
  std::vector<Part> parts_;  // by I/O tag; the I/O thread's (workers get copies)
  Mutex mu_;
  std::vector<Check> checks_ ABSL_GUARDED_BY(mu_);  // by record (`stream`: its feeder's)
  size_t landing_ ABSL_GUARDED_BY(mu_) = 0;  // parts handed to workers, not yet landed
  size_t copying_ ABSL_GUARDED_BY(mu_) = 0;  // of those, the ones holding a chunk
  absl::Status landing_status_ ABSL_GUARDED_BY(mu_);  // first checksum failure
  std::atomic<bool> failed_{false};                   // `landing_status_` is set
};

absl::Status RawRecordReads::Run() {
  absl::Status status;
  {
    IoExecutor io(files_.queue(), std::max<size_t>(files_.io().chunk_bytes, kLargeTransferBytes));
    for (size_t r = 0; r < records_.size() && status.ok() && !failed(); ++r) {
      const RecordTarget& record = records_[r];
      auto file = files_.Get(*record.dir, record.info->shard);
      if (!file.ok()) {
        status = file.status();
        break;
      }
      if (IsCompressedEncoding(record.info->encoding)) continue;  // decoded on their own
      if (record.info->raw_bytes == 0) {
        Verify(r, Xxh3(record.dst, 0));
        continue;
      }
      status = StartRecord(io, r, *file);
      if (status.ok()) status = Poll(io, /*block=*/false);
    }
    while (status.ok() && !failed() && io.transfers_in_flight() > 0) status = Poll(io, /*block=*/true);
    std::vector<uint64_t> rest;
    absl::Status drained = io.Drain(&rest);
    if (status.ok()) status = drained;
    for (uint64_t tag : rest) Finished(tag, status.ok());
  }
  // Every transfer is over; wait for the workers, then return every chunk
  // (including those of parts that never started).
  MutexLock lock(&mu_);
  mu_.Await([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return landing_ == 0; });
  chunks_.ReleaseAll();
  if (status.ok()) status = landing_status_;
  return status;
}

absl::Status RawRecordReads::StartRecord(IoExecutor& io, size_t r, File* file) {
  const TensorInfo& t = *records_[r].info;
  char* const dst = records_[r].dst;
  const uint64_t chunk_bytes = files_.io().chunk_bytes;
  const uint64_t in_place =
      t.raw_bytes > kLargeRecordBytes ? std::max(kLargeTransferBytes, chunk_bytes) : chunk_bytes;
  if (!file->direct()) {
    for (uint64_t done = 0; done < t.raw_bytes;) {
      const uint64_t n = std::min(in_place, t.raw_bytes - done);
      CKPT_RETURN_IF_ERROR(StartPart(io, file, Part{r, done, n}, dst + done, n, -1));
      done += n;
    }
  } else if (IsAlignedTo(dst, DirectMemoryAlignment(*file))) {
    // Whole blocks straight into place; the final partial block through a chunk.
    const uint64_t body = AlignDown(t.raw_bytes, kAlign);
    for (uint64_t done = 0; done < body;) {
      const uint64_t n = std::min(in_place, body - done);
      CKPT_RETURN_IF_ERROR(StartPart(io, file, Part{r, done, n}, dst + done, n, -1));
      done += n;
    }
    const uint64_t tail = t.raw_bytes - body;
    if (tail > 0) {
      size_t chunk = 0;
      CKPT_RETURN_IF_ERROR(TakeChunk(io, &chunk));
      CKPT_RETURN_IF_ERROR(StartPart(io, file, Part{r, body, tail, chunk}, chunks_.chunk(chunk),
                                     kAlign, chunks_.buf_index(chunk)));
    }
  } else {
    for (uint64_t done = 0; done < t.raw_bytes;) {
      const uint64_t n = std::min<uint64_t>(chunk_bytes, t.raw_bytes - done);
      size_t chunk = 0;
      CKPT_RETURN_IF_ERROR(TakeChunk(io, &chunk));
      CKPT_RETURN_IF_ERROR(StartPart(io, file, Part{r, done, n, chunk}, chunks_.chunk(chunk),
                                     AlignUp(n, kAlign), chunks_.buf_index(chunk)));
      done += n;
    }
  }
  return absl::OkStatus();
}

absl::Status RawRecordReads::StartPart(IoExecutor& io, File* file, Part part, void* buf,
                                       size_t length, int buf_index) {
  parts_.push_back(part);
  files_.CountRead(length);
  return io.Start(IoOp::Kind::kRead, file, records_[part.record].info->offset + part.start, buf,
                  length, parts_.size() - 1, buf_index, part.bytes);
}

absl::Status RawRecordReads::TakeChunk(IoExecutor& io, size_t* chunk) {
  CKPT_RETURN_IF_ERROR(chunks_.Ensure());
  while (!chunks_.has_free()) {
    CKPT_RETURN_IF_ERROR(Poll(io, /*block=*/false));
    if (chunks_.has_free()) break;
    // Chunks held by workers come back within a copy; those in transfers
    // once the transfer lands.
    {
      MutexLock lock(&mu_);
      mu_.Await([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return copying_ == 0 || chunks_.has_free(); });
    }
    if (chunks_.has_free()) break;
    if (io.transfers_in_flight() == 0) {
      return absl::InternalError("read: every bounce chunk is taken and none is in use");
    }
    CKPT_RETURN_IF_ERROR(Poll(io, /*block=*/true));
  }
  *chunk = chunks_.Take();
  return absl::OkStatus();
}

absl::Status RawRecordReads::Poll(IoExecutor& io, bool block) {
  std::vector<uint64_t> done;
  // The executor's error sticks: when it is OK, every reported transfer
  // moved all its bytes.
  absl::Status status = io.Poll(block, &done);
  for (uint64_t tag : done) Finished(tag, status.ok());
  return status;
}

void RawRecordReads::Finished(uint64_t tag, bool transferred) {
  const Part part = parts_[tag];
  if (!transferred || failed()) {
    if (part.chunk != SIZE_MAX) chunks_.Release(part.chunk);
    return;
  }
  const bool last = part.start + part.bytes == records_[part.record].info->raw_bytes;
  if (last && part.bytes <= kLandInlineBytes) {
    // The record's final bytes: at most they themselves are left to hash.
    Land(part);
    return;
  }
  {
    MutexLock lock(&mu_);
    ++landing_;
    if (part.chunk != SIZE_MAX) ++copying_;
  }
  chunks_.workers().Post([this, part] {
    if (part.chunk != SIZE_MAX) {
      CopyOut(part);
      MutexLock lock(&mu_);  // wakes a `TakeChunk` waiting for the chunk
      --copying_;
    }
    if (!failed()) Feed(part.record, part.start, part.bytes);
    MutexLock lock(&mu_);
    --landing_;
  });
}

void RawRecordReads::CopyOut(const Part& part) {
  std::memcpy(records_[part.record].dst + part.start, chunks_.chunk(part.chunk), part.bytes);
  chunks_.Release(part.chunk);
}

void RawRecordReads::Land(const Part& part) {
  if (part.chunk != SIZE_MAX) CopyOut(part);
  if (!failed()) Feed(part.record, part.start, part.bytes);
}

void RawRecordReads::Feed(size_t r, uint64_t start, uint64_t bytes) {
  const RecordTarget& record = records_[r];
  const uint64_t total = record.info->raw_bytes;
  if (start == 0 && bytes == total) return Verify(r, Xxh3(record.dst, total));
  mu_.Lock();
  Check& check = checks_[r];
  check.landed.emplace(start, bytes);
  if (check.feeding) {  // its feeder picks these bytes up
    mu_.UnlockQuietly();
    return;
  }
  check.feeding = true;
  if (check.stream == nullptr) check.stream = std::make_unique<Xxh3Stream>();
  Xxh3Stream* const stream = check.stream.get();
  while (!check.landed.empty() && check.landed.begin()->first == check.hashed) {
    const auto [at, n] = *check.landed.begin();
    check.landed.erase(check.landed.begin());
    mu_.UnlockQuietly();
    stream->Update(record.dst + at, n);
    mu_.Lock();
    check.hashed += n;
  }
  check.feeding = false;
  const bool complete = check.hashed == total;
  mu_.UnlockQuietly();
  if (complete) Verify(r, stream->Digest());
}

void RawRecordReads::Verify(size_t r, uint64_t actual) {
  const RecordTarget& record = records_[r];
  if (actual != record.info->xxh3) RecordError(ChecksumMismatch(*record.dir, *record.info, actual));
}

void RawRecordReads::RecordError(absl::Status status) {
  MutexLock lock(&mu_);
  if (landing_status_.ok()) landing_status_ = std::move(status);
  failed_.store(true, std::memory_order_release);
}

}  // namespace

absl::Status ReadRawRecords(ShardFiles& files, ReadChunks& chunks,
                            std::span<const RecordTarget> records) {
  return RawRecordReads(files, chunks, records).Run();
}

}  // namespace ckpt::internal
