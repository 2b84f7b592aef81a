#include "engine/record_hasher.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace ckpt::internal {

RecordHasher::RecordHasher(const std::vector<PlannedShard>& plan, std::vector<uint64_t>& hashes,
                           const std::vector<uint64_t>& block_bytes,
                           std::vector<std::vector<uint64_t>>* block_hashes)
    : plan_(plan),
      hashes_(hashes),
      block_bytes_(block_bytes),
      block_hashes_(block_hashes),
      cursors_(plan.size()) {}

void RecordHasher::UpdateBlocks(const PlannedRecord& r, Cursor& cursor, const char* data, uint64_t n) {
  const uint64_t block_bytes = BlockBytesOf(r.tensor);
  if (block_bytes == 0 || block_hashes_ == nullptr) return;
  std::vector<uint64_t>& blocks = (*block_hashes_)[r.tensor];
  if (cursor.block == nullptr) cursor.block = std::make_unique<Xxh3Stream>();
  while (n > 0) {
    const uint64_t take = std::min(n, block_bytes - cursor.block_filled);
    cursor.block->Update(data, take);
    cursor.block_filled += take;
    data += take;
    n -= take;
    const uint64_t seen = blocks.size() * block_bytes + cursor.block_filled;
    if (cursor.block_filled == block_bytes || seen == r.bytes) {
      blocks.push_back(cursor.block->Digest());
      cursor.block->Reset();
      cursor.block_filled = 0;
    }
  }
}

RecordHasher::~RecordHasher() = default;

void RecordHasher::SkipEmpty(size_t shard, Cursor& cursor) {
  const std::vector<PlannedRecord>& records = plan_[shard].records;
  while (cursor.record < records.size() && records[cursor.record].bytes == 0) {
    hashes_[records[cursor.record].tensor] = Xxh3(nullptr, 0);
    ++cursor.record;
  }
}

absl::Status RecordHasher::Consume(const StagedChunk& c, const char* data) {
  if (c.shard >= cursors_.size()) {
    return absl::InternalError(absl::StrCat("staged chunk names shard ", c.shard, " of ",
                                            cursors_.size()));
  }
  Cursor& cursor = cursors_[c.shard];
  if (c.file_offset != cursor.next_offset) {
    return absl::InternalError(absl::StrCat("staged chunk of shard ", plan_[c.shard].file,
                                            " starts at ", c.file_offset, ", expected ",
                                            cursor.next_offset));
  }
  const std::vector<PlannedRecord>& records = plan_[c.shard].records;
  const uint64_t end = c.file_offset + c.bytes;
  uint64_t position = c.file_offset;
  SkipEmpty(c.shard, cursor);
  while (cursor.record < records.size()) {
    const PlannedRecord& r = records[cursor.record];
    const uint64_t from = std::max(position, r.offset);
    if (from >= end) break;  // the record starts in a later chunk
    const uint64_t to = std::min(end, r.offset + r.bytes);
    if (cursor.open == nullptr) cursor.open = std::make_unique<Xxh3Stream>();
    cursor.open->Update(data + (from - c.file_offset), to - from);
    UpdateBlocks(r, cursor, data + (from - c.file_offset), to - from);
    position = to;
    if (to < r.offset + r.bytes) break;  // continues in the next chunk
    hashes_[r.tensor] = cursor.open->Digest();
    cursor.open->Reset();
    ++cursor.record;
    SkipEmpty(c.shard, cursor);
  }
  cursor.next_offset = end;
  if (cursor.record == records.size()) cursor.open.reset();
  return absl::OkStatus();
}

absl::Status RecordHasher::Finish() {
  for (size_t s = 0; s < cursors_.size(); ++s) {
    SkipEmpty(s, cursors_[s]);
    if (cursors_[s].record < plan_[s].records.size()) {
      const PlannedRecord& r = plan_[s].records[cursors_[s].record];
      return absl::InternalError(absl::StrCat("tensor ", r.tensor, " of shard ", plan_[s].file,
                                              " was not completely staged (", cursors_[s].next_offset,
                                              " of its shard's bytes seen)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace ckpt::internal
