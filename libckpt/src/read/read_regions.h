// Reading boxes of tensors out of the records that hold them (a sharded
// tensor's chunks, or a tensor's one record): the engine of
// `Reader::ReadRegions`.
#ifndef CKPT_READ_READ_REGIONS_H_
#define CKPT_READ_READ_REGIONS_H_

#include <functional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "ckpt/dtype.h"
#include "read/delta_chain.h"
#include "read/read_chunks.h"
#include "read/region_box.h"
#include "read/shard_files.h"

namespace ckpt::internal {

// Tensor `*name` of the checkpoint `*chain` opens.
struct RecordRef {
  const DeltaChain* chain = nullptr;
  const std::string* name = nullptr;
};

// Reads each whole record (rebuilt through its chain) into the matching
// destination (room for its raw bytes), verified: the reader's bulk path.
using ReadWholeFn =
    std::function<absl::Status(std::span<const RecordRef> records, std::span<char* const> dsts)>;

// A record and the box of the tensor it holds.
struct RegionPiece {
  RecordRef record;
  Box box;
};

// One box of one tensor, and the pieces the tensor was saved in.
struct RegionRead {
  DType dtype = DType::kFloat32;
  Box region;
  char* dst = nullptr;  // room for `region`, row-major
  std::vector<RegionPiece> pieces;
};

// Fills every read's `dst`. A piece the region holds whole, and that lies
// contiguously in it, is read straight into place (all such at once); of a
// piece stored whole only the blocks the region overlaps are read, each
// checked against its `block_xxh3` (or the record's xxh3 for a record of
// one block); any other piece the region touches is read whole into a
// buffer, verified, and the overlap copied out.
absl::Status ReadRegionPieces(ShardFiles& files, ReadChunks& chunks, std::span<const RegionRead> reads,
                              const ReadWholeFn& read_whole);

}  // namespace ckpt::internal

#endif  // CKPT_READ_READ_REGIONS_H_
