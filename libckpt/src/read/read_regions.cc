#include "read/read_regions.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "read/read_raw_records.h"
#include "util/status_macros.h"

namespace ckpt::internal {
namespace {

// The part of one piece a region needs, once the direct reads are done.
struct Overlap {
  const RegionRead* read = nullptr;
  const RegionPiece* piece = nullptr;
  Box box;  // inside both the region and the piece
};

// Copies `overlap.box` from `src`, which holds the piece's bytes from byte
// `src_from` on, into the region's buffer.
void CopyOverlap(const Overlap& overlap, const char* src, uint64_t src_from) {
  const uint64_t element = DTypeSize(overlap.read->dtype);
  char* const dst = overlap.read->dst;
  ForEachRun(overlap.box, overlap.piece->box, overlap.read->region,
             [&](uint64_t from, uint64_t to, uint64_t elements) {
               std::memcpy(dst + to * element, src + (from * element - src_from), elements * element);
             });
}

class RegionReads {
 public:
  RegionReads(ShardFiles& files, ReadChunks& chunks, const ReadWholeFn& read_whole)
      : files_(files), chunks_(chunks), read_whole_(read_whole) {}

  absl::Status Run(std::span<const RegionRead> reads);

 private:
  // Reads the blocks of a whole record `t` (the newest of its chain) that
  // `overlap` needs into `buffer_`, then copies the overlap out.
  absl::Status ReadBlocks(const Overlap& overlap, const std::string& dir, const TensorInfo& t);
  // Reads the piece whole into `buffer_`, then copies the overlap out.
  absl::Status ReadWholePiece(const Overlap& overlap, const TensorInfo& t);
  absl::Status EnsureBuffer(uint64_t bytes);

  ShardFiles& files_;
  ReadChunks& chunks_;
  const ReadWholeFn& read_whole_;
  AlignedBytes buffer_;  // reused from piece to piece
};

absl::Status RegionReads::Run(std::span<const RegionRead> reads) {
  std::vector<RecordRef> direct;
  std::vector<char*> direct_dsts;
  std::vector<Overlap> rest;
  for (const RegionRead& read : reads) {
    const uint64_t element = DTypeSize(read.dtype);
    for (const RegionPiece& piece : read.pieces) {
      std::optional<Box> box = Intersect(read.region, piece.box);
      if (!box.has_value() || box->empty()) continue;
      if (*box == piece.box && IsContiguousIn(piece.box, read.region)) {
        uint64_t at = 0;
        ForEachRun(piece.box, piece.box, read.region, [&](uint64_t, uint64_t to, uint64_t) { at = to; });
        direct.push_back(piece.record);
        direct_dsts.push_back(read.dst + at * element);
      } else {
        rest.push_back(Overlap{&read, &piece, std::move(*box)});
      }
    }
  }
  if (!direct.empty()) CKPT_RETURN_IF_ERROR(read_whole_(direct, direct_dsts));
  for (const Overlap& overlap : rest) {
    const DeltaChain& chain = *overlap.piece->record.chain;
    const std::string& name = *overlap.piece->record.name;
    CKPT_ASSIGN_OR_RETURN(size_t base, chain.BaseLinkOf(name));
    const TensorInfo* t = chain.Find(base, name);
    if (t == nullptr) return absl::InternalError(absl::StrCat("no record of \"", name, "\" in its chain"));
    if (base + 1 == chain.size() && t->encoding == RecordEncoding::kRaw) {
      CKPT_RETURN_IF_ERROR(ReadBlocks(overlap, chain.link(base).dir, *t));
    } else {
      CKPT_RETURN_IF_ERROR(ReadWholePiece(overlap, *t));
    }
  }
  return absl::OkStatus();
}

absl::Status RegionReads::EnsureBuffer(uint64_t bytes) {
  if (buffer_.size() >= bytes && buffer_.data() != nullptr) return absl::OkStatus();
  CKPT_ASSIGN_OR_RETURN(buffer_, AlignedBytes::Allocate(std::max<uint64_t>(bytes, 1), false));
  return absl::OkStatus();
}

absl::Status RegionReads::ReadBlocks(const Overlap& overlap, const std::string& dir, const TensorInfo& t) {
  // A record without block hashes is one block.
  const uint64_t block = t.block_bytes != 0 ? t.block_bytes : std::max<uint64_t>(t.raw_bytes, 1);
  const uint64_t blocks = (t.raw_bytes + block - 1) / block;
  const uint64_t element = DTypeSize(overlap.read->dtype);
  std::vector<bool> needed(blocks, false);
  ForEachRun(overlap.box, overlap.piece->box, overlap.read->region, [&](uint64_t from, uint64_t, uint64_t n) {
    const uint64_t first = from * element / block;
    const uint64_t last = ((from + n) * element - 1) / block;
    for (uint64_t b = first; b <= last; ++b) needed[b] = true;
  });
  const uint64_t first = std::find(needed.begin(), needed.end(), true) - needed.begin();
  const uint64_t last = needed.rend() - std::find(needed.rbegin(), needed.rend(), true) - 1;
  const uint64_t from = first * block;
  const uint64_t to = std::min(t.raw_bytes, (last + 1) * block);
  CKPT_RETURN_IF_ERROR(EnsureBuffer(to - from));
  // Each needed block is a record of its own to ReadRawRecords: read in
  // parallel, each checked against its own hash.
  std::vector<TensorInfo> parts;
  parts.reserve(last - first + 1);
  std::vector<RecordTarget> targets;
  for (uint64_t b = first; b <= last; ++b) {
    if (!needed[b]) continue;
    TensorInfo part;
    part.name = t.block_bytes != 0 ? absl::StrCat(t.name, " (block ", b, ")") : t.name;
    part.dtype = DType::kUInt8;
    part.shard = t.shard;
    part.offset = t.offset + b * block;
    part.raw_bytes = part.stored_bytes = std::min(block, t.raw_bytes - b * block);
    part.shape = {static_cast<int64_t>(part.raw_bytes)};
    part.xxh3 = t.block_bytes != 0 ? t.block_xxh3[b] : t.xxh3;
    parts.push_back(std::move(part));
  }
  size_t next = 0;
  for (uint64_t b = first; b <= last; ++b) {
    if (!needed[b]) continue;
    targets.push_back(RecordTarget{&dir, &parts[next++],
                                   static_cast<char*>(buffer_.data()) + (b * block - from)});
  }
  CKPT_RETURN_IF_ERROR(ReadRawRecords(files_, chunks_, targets));
  CopyOverlap(overlap, static_cast<const char*>(buffer_.data()), from);
  return absl::OkStatus();
}

absl::Status RegionReads::ReadWholePiece(const Overlap& overlap, const TensorInfo& t) {
  CKPT_RETURN_IF_ERROR(EnsureBuffer(t.raw_bytes));
  char* dst = static_cast<char*>(buffer_.data());
  CKPT_RETURN_IF_ERROR(read_whole_({&overlap.piece->record, 1}, {&dst, 1}));
  CopyOverlap(overlap, dst, 0);
  return absl::OkStatus();
}

}  // namespace

absl::Status ReadRegionPieces(ShardFiles& files, ReadChunks& chunks, std::span<const RegionRead> reads,
                              const ReadWholeFn& read_whole) {
  return RegionReads(files, chunks, read_whole).Run(reads);
}

}  // namespace ckpt::internal
