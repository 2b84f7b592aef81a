// The record codecs: one entry per `RecordEncoding` saying what the
// encoding is (its manifest name, whether it is a delta, whether a full
// record of it is stored compressed), the fewest stored bytes a valid
// record of it can take, and how it decodes. Every reader and validator
// asks this table, never tests for an encoding by name; the engine's
// encoders are chosen in engine/shard_encoder.h (`NewShardEncoder`).
// Adding a codec: docs/format.md, "Adding a record codec".
#ifndef CKPT_CODEC_RECORD_CODECS_H_
#define CKPT_CODEC_RECORD_CODECS_H_

#include <cstddef>
#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "ckpt/dtype.h"
#include "ckpt/kinds.h"
#include "ckpt/options.h"
#include "util/worker_pool.h"

namespace ckpt::internal {

// Decodes the `stored_bytes` bytes of one record of a tensor of `dtype` into
// dst[0, n): a full record writes the tensor's value there; a delta applies
// itself to the base value dst holds. kDataLoss naming what is malformed;
// nothing is written past n. `pool` (may be null) decodes blocks in
// parallel where the encoding has them (REQUIRES: not called from its work).
using RecordDecodeFn = absl::Status (*)(const char* stored, size_t stored_bytes, char* dst,
                                        size_t n, DType dtype, WorkerPool* pool);

struct RecordCodec {
  RecordEncoding encoding;
  absl::string_view name;  // in manifests and every printed form
  bool is_delta;           // applies to the base step's value of the tensor
  // A full record stored encoded: read and decoded one record at a time
  // (read/decode_record.h), not streamed into place like a raw one.
  bool is_compressed;
  // The fewest stored bytes a valid record holding `raw_bytes` can take:
  // a manifest claiming fewer is refused before a reader allocates
  // `raw_bytes` for it.
  uint64_t (*min_stored_bytes)(uint64_t raw_bytes);
  RecordDecodeFn decode;
  // The `compression.codec` whose full records are of this encoding, if any
  // (its option name is this entry's `name`: `CompressionCodecName`).
  std::optional<CompressionCodec> selected_by;
};

// The entry of `encoding`; an unknown value (a corrupt enum) gets an entry
// named "unknown" whose decode is kDataLoss.
const RecordCodec& CodecOf(RecordEncoding encoding);

// Every codec, in the order of `RecordEncoding`.
absl::Span<const RecordCodec> AllRecordCodecs();

}  // namespace ckpt::internal

#endif  // CKPT_CODEC_RECORD_CODECS_H_
