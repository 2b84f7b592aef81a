#include "read/verify_full.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
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
    if (IsCompressedEncoding(t.encoding)) {
      CKPT_RETURN_IF_ERROR(DecodeCompressedRecord(files, dir, t, nullptr));
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
  // A record's block hashes (a sharded chunk's) are checked in the same
  // pass: its bytes `data[0, n)` start at `start` of the record.
  Xxh3Stream block_hash;
  auto check_blocks = [&](const TensorInfo& t, uint64_t start, const char* data, uint64_t n) -> absl::Status {
    if (t.block_bytes == 0) return absl::OkStatus();
    for (uint64_t at = start; at < start + n;) {
      if (at % t.block_bytes == 0) block_hash.Reset();
      const uint64_t block_end = std::min(t.raw_bytes, (at / t.block_bytes + 1) * t.block_bytes);
      const uint64_t take = std::min(block_end, start + n) - at;
      block_hash.Update(data + (at - start), take);
      at += take;
      if (at == block_end && block_hash.Digest() != t.block_xxh3[(at - 1) / t.block_bytes]) {
        TensorInfo block = t;
        block.name = absl::StrCat(t.name, " (block ", (at - 1) / t.block_bytes, ")");
        block.offset = t.offset + (at - 1) / t.block_bytes * t.block_bytes;
        block.xxh3 = t.block_xxh3[(at - 1) / t.block_bytes];
        return ChecksumMismatch(dir, block, block_hash.Digest());
      }
    }
    return absl::OkStatus();
  };
  auto consume = [&]() -> absl::Status {
    while (head < ring.size() && ring[head].done) {
      Piece& p = ring[head];
      const TensorInfo& t = tensors[p.tensor];
      if (p.start == 0) hash.Reset();
      hash.Update(chunks.chunk(p.chunk), p.bytes);
      absl::Status blocks = check_blocks(t, p.start, chunks.chunk(p.chunk), p.bytes);
      chunks.Release(p.chunk);
      CKPT_RETURN_IF_ERROR(blocks);
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
           (tensors[next_tensor].raw_bytes == 0 || IsCompressedEncoding(tensors[next_tensor].encoding))) {
      const TensorInfo& t = tensors[next_tensor];
      if (!IsCompressedEncoding(t.encoding) && Xxh3(nullptr, 0) != t.xxh3) {
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
