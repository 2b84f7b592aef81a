#include "read/verify_full.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <vector>

#include "io/io_executor.h"
#include "read/decode_record.h"
#include "util/hash.h"
#include "util/status_macros.h"
#include "ckpt/file_system.h"

namespace ckpt::internal {

absl::Status VerifyFullCheckpoint(ShardFiles& files, ReadChunks& chunks, const std::string& dir,
                                  const Manifest& manifest, const VerifyProgress& progress) {
  CKPT_RETURN_IF_ERROR(chunks.Ensure());
  auto count = [&](uint64_t bytes) {
    if (progress && bytes > 0) progress(bytes);
  };
  const std::vector<TensorInfo>& tensors = manifest.tensors;
  for (const TensorInfo& t : tensors) {
    if (t.encoding == RecordEncoding::kZstd) {
      CKPT_RETURN_IF_ERROR(DecodeZstdRecord(files, dir, t, nullptr));
      count(t.raw_bytes);
    }
  }
  // Pieces are consumed strictly in order (the hash is streamed), while up to
  // a pool's worth of them is in flight.
  struct Piece {
    size_t tensor;
    uint64_t start;  // within the record
    size_t bytes;
    size_t chunk;
    bool done;
  };
  std::vector<Piece> ring;  // window of started pieces, oldest first
  size_t head = 0;
  Xxh3Stream hash;
  absl::Status status;
  const size_t chunk_bytes = files.io().chunk_bytes;
  IoExecutor io(files.queue(), chunk_bytes);
  std::vector<uint64_t> done_tags;
  size_t next_tensor = 0;
  uint64_t next_start = 0;
  chunks.ReleaseAll();
  std::map<size_t, size_t> chunk_to_piece;
  auto consume = [&]() -> absl::Status {
    while (head < ring.size() && ring[head].done) {
      Piece& p = ring[head];
      const TensorInfo& t = tensors[p.tensor];
      if (p.start == 0) hash.Reset();
      hash.Update(chunks.chunk(p.chunk), p.bytes);
      chunks.Release(p.chunk);
      if (p.start + p.bytes == t.raw_bytes && hash.Digest() != t.xxh3) {
        return ChecksumMismatch(dir, t, hash.Digest());
      }
      count(p.bytes);
      ++head;
    }
    return absl::OkStatus();
  };
  while (status.ok()) {
    // Empty and compressed tensors are checked on their own (compressed
    // ones before this loop).
    while (status.ok() && next_tensor < tensors.size() &&
           (tensors[next_tensor].raw_bytes == 0 || tensors[next_tensor].encoding == RecordEncoding::kZstd)) {
      const TensorInfo& t = tensors[next_tensor];
      if (t.encoding != RecordEncoding::kZstd && Xxh3(nullptr, 0) != t.xxh3) {
        status = ChecksumMismatch(dir, t, Xxh3(nullptr, 0));
      }
      ++next_tensor;
    }
    if (!status.ok()) break;
    const bool more = next_tensor < tensors.size();
    if (more && chunks.has_free()) {
      const TensorInfo& t = tensors[next_tensor];
      auto file = files.Get(dir, t.shard);
      if (!file.ok()) {
        status = file.status();
        break;
      }
      const size_t n = std::min<uint64_t>(chunk_bytes, t.raw_bytes - next_start);
      const size_t chunk = chunks.Take();
      ring.push_back(Piece{next_tensor, next_start, n, chunk, false});
      chunk_to_piece[chunk] = ring.size() - 1;
      const size_t length = (*file)->direct() ? AlignUp(n, kDirectIoAlignment) : n;
      files.CountRead(length);
      status = io.Start(IoOp::Kind::kRead, *file, t.offset + next_start, chunks.chunk(chunk),
                        length, chunk, chunks.buf_index(chunk), n);
      next_start += n;
      if (next_start == t.raw_bytes) {
        ++next_tensor;
        next_start = 0;
      }
      continue;
    }
    if (!more && head == ring.size()) break;
    done_tags.clear();
    status = io.Poll(/*block=*/true, &done_tags);
    for (uint64_t chunk : done_tags) ring[chunk_to_piece[chunk]].done = true;
    if (status.ok()) status = consume();
  }
  absl::Status drained = io.Drain();
  chunks.ReleaseAll();
  return status.ok() ? drained : status;
}

}  // namespace ckpt::internal
