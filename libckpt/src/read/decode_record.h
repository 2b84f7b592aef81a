// Reading one tensor's records one at a time and decoding them into a
// buffer: a compressed record, or the deltas that bring a whole record forward
// along a delta chain. Each result is checked against the manifest's XXH3.
// (Raw records are read many at a time by `ReadRawRecords`.)
#ifndef CKPT_READ_DECODE_RECORD_H_
#define CKPT_READ_DECODE_RECORD_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ckpt/reader.h"
#include "ckpt/tensor.h"
#include "codec/record_codecs.h"
#include "read/delta_chain.h"
#include "read/read_raw_records.h"
#include "read/shard_files.h"

namespace ckpt::internal {

// kDataLoss for tensor `t` of checkpoint `dir` whose bytes hash to `actual`
// instead of the manifest's XXH3, naming the shard and offset.
absl::Status ChecksumMismatch(const std::string& dir, const TensorInfo& t, uint64_t actual);

// kDataLoss for the record of tensor `t` of checkpoint `dir` whose stored
// bytes hash to `actual` instead of the manifest's `stored_xxh3`, naming the
// shard and offset. REQUIRES: `t.stored_xxh3`.
absl::Status StoredChecksumMismatch(const std::string& dir, const TensorInfo& t, uint64_t actual);

// OK when `t` records no `stored_xxh3` or `stored[0, t.stored_bytes)`
// hashes to it; else `StoredChecksumMismatch`.
absl::Status CheckStoredBytes(const std::string& dir, const TensorInfo& t, const char* stored);

// Reads the `t.stored_bytes` stored bytes of `t`'s record (e.g. a delta
// payload) from its shard in `dir` into new memory, undecoded, and checks
// them against `t.stored_xxh3` when the manifest records one.
absl::StatusOr<AlignedBytes> ReadStoredRecord(ShardFiles& files, const std::string& dir,
                                              const TensorInfo& t);

// Whether `encoding` stores a whole record compressed: read and decoded one
// record at a time (`DecodeCompressedRecord`), not streamed like raw ones.
inline bool IsCompressedEncoding(RecordEncoding encoding) {
  return CodecOf(encoding).is_compressed;
}

// Reads the compressed full record of `t` in `dir` (any encoding whose
// codec `is_compressed`) and decodes it into `dst` (room for `t.raw_bytes`)
// or, when `dst` is null, into memory of its own, only to check it;
// verifies the XXH3 of the decoded bytes (and, when that or the decoder
// fails, the stored bytes' `stored_xxh3`, to name which is wrong). Corrupt
// or mis-sized data is kDataLoss naming the record and its codec.
absl::Status DecodeCompressedRecord(ShardFiles& files, const std::string& dir, const TensorInfo& t,
                                    char* dst);

// `DecodeCompressedRecord` for each of `records`, in order, pipelined: the
// next record's stored bytes are read (on this thread, through `files`'
// queue) while a decoder thread decodes this one with `files.codec_pool()`
// and a hasher thread checks the one before. One ring of memory, twice the
// largest record, serves them all: the reader goes on into the room left
// while a large record decodes. Stops at the first failure and returns it.
absl::Status DecodeCompressedRecords(ShardFiles& files, std::span<const RecordTarget> records);

// The records of tensor `name` in the links after `base` of `chain`, oldest
// first: what brings its value at `base` forward. kDataLoss if a link lacks
// it or it changes dtype or shape along the chain.
absl::StatusOr<std::vector<const TensorInfo*>> DeltaLinksOf(const DeltaChain& chain,
                                                            absl::string_view name, size_t base);

// Applies the deltas of tensor `name` stored after link `base` of `chain`,
// oldest first, to `dst` (holding its value at `base`), one link at a time:
// each read on its own and checked by its stored bytes' checksum (when
// recorded) and by the value's after it is applied, so that a failure names
// the link. A tensor whose dtype or shape changes along the chain, or a
// malformed delta, is kDataLoss. The slow path: `ApplyChains` (bulk, one
// check per tensor) falls back to it to name a bad link.
absl::Status ApplyDeltas(ShardFiles& files, const DeltaChain& chain, absl::string_view name,
                         size_t base, char* dst);

}  // namespace ckpt::internal

#endif  // CKPT_READ_DECODE_RECORD_H_
