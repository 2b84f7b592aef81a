// Whole-record "planes" encoding and decoding for tests, benches and fuzz
// seeds. The engine never encodes a whole record at once (it appends a block
// per staged chunk, engine/shard_encoder.cc) and readers decode through the
// codec table (codec/record_codecs.h), so these live here, in ckpt_testing,
// not in the library.
#ifndef CKPT_TESTING_CODEC_TESTING_H_
#define CKPT_TESTING_CODEC_TESTING_H_

#include <cstddef>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckpt/dtype.h"
#include "delta/delta_codec.h"
#include "util/worker_pool.h"

namespace ckpt::internal {

// A full record as "planes": the blocks of X's bytes (kPlaneBlockBytes each,
// the last shorter), encoded on `pool` when given -- the payload the engine
// writes for the same record.
absl::StatusOr<std::vector<char>> EncodePlanesRecord(std::span<const Piece> x, size_t n, DType dtype,
                                                     int zstd_level, WorkerPool* pool = nullptr);

// Decodes a "planes" record into dst[0, n) (the codec table's decode).
// kDataLoss on a malformed payload.
absl::Status DecodePlanesRecord(const char* payload, size_t payload_bytes, char* dst, size_t n,
                                DType dtype, WorkerPool* pool = nullptr);

}  // namespace ckpt::internal

#endif  // CKPT_TESTING_CODEC_TESTING_H_
