// Reading many raw records into caller memory at once, with many transfers
// in flight: the bulk path of `Reader::ReadInto`.
#ifndef CKPT_READ_READ_RAW_RECORDS_H_
#define CKPT_READ_READ_RAW_RECORDS_H_

#include <span>
#include <string>

#include "absl/status/status.h"
#include "ckpt/reader.h"
#include "read/read_chunks.h"
#include "read/shard_files.h"

namespace ckpt::internal {

// One whole (not delta) record and where its bytes go.
struct RecordTarget {
  const std::string* dir = nullptr;  // checkpoint directory holding the record
  const TensorInfo* info = nullptr;
  char* dst = nullptr;  // room for `info->raw_bytes`
};

// Reads the raw record of each of `records` into its `dst` and checks it
// against its XXH3. Memory that is 4 KiB-aligned gets whole blocks straight
// from O_DIRECT reads and only its final partial block through `chunks`;
// other memory (and buffered files) is filled chunk by chunk. zstd records
// are skipped: decode them with `DecodeCompressedRecord` beforehand. Returns the
// first error, after every transfer has finished; every chunk is free again.
absl::Status ReadRawRecords(ShardFiles& files, ReadChunks& chunks,
                            std::span<const RecordTarget> records);

}  // namespace ckpt::internal

#endif  // CKPT_READ_READ_RAW_RECORDS_H_
