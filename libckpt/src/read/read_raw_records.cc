#include "read/read_raw_records.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "io/io_executor.h"
#include "read/decode_record.h"
#include "util/hash.h"
#include "util/status_macros.h"
#include "ckpt/file_system.h"

namespace ckpt::internal {
namespace {

constexpr uint64_t kAlign = kDirectIoAlignment;
bool IsAligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kAlign == 0; }

// One call of `ReadRawRecords`: each record is read in one or more parts,
// and checked once its last part has arrived.
class RawRecordReads {
 public:
  RawRecordReads(ShardFiles& files, ReadChunks& chunks, std::span<const RecordTarget> records)
      : files_(files), chunks_(chunks), records_(records), parts_left_(records.size(), 0) {}

  absl::Status Run();

 private:
  // One transfer: either straight into the caller's memory, or into a chunk
  // that is then copied there.
  struct Part {
    size_t record = 0;
    char* dst = nullptr;      // where the bytes finally go
    size_t copy_bytes = 0;    // bytes to copy from `chunk` (0: read in place)
    size_t chunk = SIZE_MAX;  // chunk used, if any
  };

  // Starts every part of record `r` (not empty) from `file`.
  absl::Status StartRecord(IoExecutor& io, size_t r, File* file);
  absl::Status AddPart(IoExecutor& io, File* file, Part part, uint64_t offset, void* buf,
                       size_t length, size_t required, int buf_index);
  // A free chunk, waiting for transfers to complete if none is.
  absl::Status TakeChunk(IoExecutor& io, size_t* chunk);
  // Completes whatever has finished; with `block`, waits for one first.
  absl::Status Poll(IoExecutor& io, bool block);
  absl::Status Complete(uint64_t part_tag);
  absl::Status FinishRecord(size_t r);

  ShardFiles& files_;
  ReadChunks& chunks_;
  const std::span<const RecordTarget> records_;
  std::vector<size_t> parts_left_;  // by record
  std::vector<Part> parts_;         // by I/O tag
};

absl::Status RawRecordReads::Run() {
  absl::Status status;
  {
    IoExecutor io(files_.queue(), files_.io().chunk_bytes);
    for (size_t r = 0; r < records_.size() && status.ok(); ++r) {
      const RecordTarget& record = records_[r];
      auto file = files_.Get(*record.dir, record.info->shard);
      if (!file.ok()) {
        status = file.status();
        break;
      }
      if (IsCompressedEncoding(record.info->encoding)) continue;  // decoded on their own
      if (record.info->raw_bytes == 0) {
        status = FinishRecord(r);
        continue;
      }
      status = StartRecord(io, r, *file);
      if (status.ok()) status = Poll(io, /*block=*/false);
    }
    while (status.ok() && io.transfers_in_flight() > 0) status = Poll(io, /*block=*/true);
    std::vector<uint64_t> rest;
    absl::Status drained = io.Drain(&rest);
    if (status.ok()) status = drained;
    for (uint64_t tag : rest) {
      absl::Status c = Complete(tag);
      if (status.ok()) status = c;
    }
  }
  // Return every chunk, including those of abandoned parts.
  chunks_.ReleaseAll();
  return status;
}

absl::Status RawRecordReads::StartRecord(IoExecutor& io, size_t r, File* file) {
  const TensorInfo& t = *records_[r].info;
  char* const dst = records_[r].dst;
  parts_left_[r] = 1;  // held until every part is started
  if (!file->direct()) {
    CKPT_RETURN_IF_ERROR(
        AddPart(io, file, Part{r, dst}, t.offset, dst, t.raw_bytes, t.raw_bytes, -1));
  } else if (IsAligned(dst)) {
    // Whole blocks straight into place; the final partial block through a chunk.
    const uint64_t body = AlignDown(t.raw_bytes, kAlign);
    if (body > 0) {
      CKPT_RETURN_IF_ERROR(AddPart(io, file, Part{r, dst}, t.offset, dst, body, body, -1));
    }
    const uint64_t tail = t.raw_bytes - body;
    if (tail > 0) {
      size_t chunk = 0;
      CKPT_RETURN_IF_ERROR(TakeChunk(io, &chunk));
      CKPT_RETURN_IF_ERROR(AddPart(io, file, Part{r, dst + body, tail, chunk}, t.offset + body,
                                   chunks_.chunk(chunk), kAlign, tail, chunks_.buf_index(chunk)));
    }
  } else {
    const uint64_t chunk_bytes = files_.io().chunk_bytes;
    for (uint64_t done = 0; done < t.raw_bytes;) {
      const uint64_t n = std::min<uint64_t>(chunk_bytes, t.raw_bytes - done);
      size_t chunk = 0;
      CKPT_RETURN_IF_ERROR(TakeChunk(io, &chunk));
      CKPT_RETURN_IF_ERROR(AddPart(io, file, Part{r, dst + done, n, chunk}, t.offset + done,
                                   chunks_.chunk(chunk), AlignUp(n, kAlign), n, chunks_.buf_index(chunk)));
      done += n;
    }
  }
  if (--parts_left_[r] == 0) return FinishRecord(r);
  return absl::OkStatus();
}

absl::Status RawRecordReads::AddPart(IoExecutor& io, File* file, Part part, uint64_t offset,
                                     void* buf, size_t length, size_t required, int buf_index) {
  parts_.push_back(part);
  ++parts_left_[part.record];
  files_.CountRead(length);
  return io.Start(IoOp::Kind::kRead, file, offset, buf, length, parts_.size() - 1, buf_index,
                  required);
}

absl::Status RawRecordReads::TakeChunk(IoExecutor& io, size_t* chunk) {
  CKPT_RETURN_IF_ERROR(chunks_.Ensure());
  while (!chunks_.has_free()) {
    std::vector<uint64_t> done;
    CKPT_RETURN_IF_ERROR(io.Poll(/*block=*/true, &done));
    for (uint64_t tag : done) CKPT_RETURN_IF_ERROR(Complete(tag));
  }
  *chunk = chunks_.Take();
  return absl::OkStatus();
}

absl::Status RawRecordReads::Poll(IoExecutor& io, bool block) {
  std::vector<uint64_t> done;
  absl::Status status = io.Poll(block, &done);
  for (uint64_t tag : done) {
    absl::Status c = Complete(tag);
    if (status.ok()) status = c;
  }
  return status;
}

absl::Status RawRecordReads::Complete(uint64_t part_tag) {
  Part& part = parts_[part_tag];
  if (part.chunk != SIZE_MAX) {
    std::memcpy(part.dst, chunks_.chunk(part.chunk), part.copy_bytes);
    chunks_.Release(part.chunk);
    part.chunk = SIZE_MAX;
  }
  if (--parts_left_[part.record] == 0) return FinishRecord(part.record);
  return absl::OkStatus();
}

absl::Status RawRecordReads::FinishRecord(size_t r) {
  const RecordTarget& record = records_[r];
  const uint64_t actual = Xxh3(record.dst, record.info->raw_bytes);
  if (actual != record.info->xxh3) return ChecksumMismatch(*record.dir, *record.info, actual);
  return absl::OkStatus();
}

}  // namespace

absl::Status ReadRawRecords(ShardFiles& files, ReadChunks& chunks,
                            std::span<const RecordTarget> records) {
  return RawRecordReads(files, chunks, records).Run();
}

}  // namespace ckpt::internal
