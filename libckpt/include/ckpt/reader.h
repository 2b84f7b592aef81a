// ckpt/reader.h: reads one committed checkpoint back.
//
//   ckpt::ReaderOptions options;                  // newest checkpoint
//   auto reader = ckpt::Reader::Open("/ckpt/run1", options);
//   for (const ckpt::TensorInfo& t : (*reader)->tensors()) { ... }
//   auto w = (*reader)->Read("model.fc.weight");  // verified against its xxh3
//
// Everything read is checked: the manifest against its own checksum and
// bounds (before any allocation it implies), every tensor against the xxh3
// of its bytes. A mismatch is kDataLoss naming the file and the tensor.
#ifndef CKPT_READER_H_
#define CKPT_READER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"
#include "ckpt/kinds.h"
#include "ckpt/options.h"
#include "ckpt/tensor.h"

namespace ckpt {

// One tensor as the manifest describes it.
struct TensorInfo {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  uint64_t raw_bytes = 0;     // bytes of the tensor itself
  uint64_t stored_bytes = 0;  // bytes of its record in the shard file
  // How the record stores the tensor (ckpt/kinds.h; docs/format.md, the
  // `encoding` table): whole, or for a delta against the same tensor of the
  // base step.
  RecordEncoding encoding = RecordEncoding::kRaw;
  std::string shard;          // shard file name, inside the checkpoint dir
  uint64_t offset = 0;        // 4 KiB-aligned offset of the record in `shard`
  uint64_t xxh3 = 0;          // XXH3-64 of the raw bytes (as restored)
  // XXH3-64 of the record's `stored_bytes` bytes as written (the manifest's
  // "stored_xxh3"), recorded for delta records (and allowed on any other).
  // A reader checks each link of a delta chain by it before applying the
  // link, and the restored value once, by `xxh3`, at the end. Absent in
  // checkpoints written before it existed: their deltas are checked by
  // `xxh3` after each link is applied.
  std::optional<uint64_t> stored_xxh3;
  // For a lossy (top-k) delta: the largest absolute difference between a
  // restored element and the value that was saved; 0 when exact.
  double error_bound = 0;
  // A multi-rank checkpoint's tensors: how the saving rank placed it, and
  // which rank's part holds it (0 in a single-process checkpoint).
  TensorPlacement placement = TensorPlacement::kDefault;
  int rank = 0;
  // `kSharded`: a global tensor saved in chunks by several ranks. Every view
  // of the checkpoint shows it once, whole: `shape` is the global shape,
  // `raw_bytes` its size, `stored_bytes` the sum of its chunks' records,
  // `rank` -1, and `chunks` where each piece lies (`shard`, `offset`, `xxh3`,
  // `encoding` and `error_bound` describe no single record and are empty;
  // `error_bound` is the chunks' largest).
  struct Chunk {
    int rank = 0;
    std::vector<int64_t> offset;  // where it starts in the global tensor
    std::vector<int64_t> shape;
    uint64_t stored_bytes = 0;
    RecordEncoding encoding = RecordEncoding::kRaw;
    std::string shard;  // the shard file holding its record (or its delta)
  };
  std::vector<Chunk> chunks;
  // Of one record of a chunk (a rank's part manifest; docs/format.md): the
  // global tensor it is part of and where it starts in it. For a record
  // stored whole and larger than one block, the XXH3-64 of each
  // `block_bytes` of it in order (the last block may be short), which lets
  // a reader check part of it.
  std::vector<int64_t> global_shape;
  std::vector<int64_t> global_offset;
  uint64_t block_bytes = 0;
  std::vector<uint64_t> block_xxh3;
};

// Where `Reader::ReadInto` puts one tensor.
struct ReadTarget {
  std::string name;
  void* data = nullptr;
  size_t capacity = 0;  // must be >= the tensor's raw_bytes
};

// Where `Reader::ReadRegions` puts one box of a tensor: elements
// `offset[d] .. offset[d] + shape[d]` of every dimension `d`, row-major and
// contiguous at `data`.
struct RegionTarget {
  std::string name;
  std::vector<int64_t> offset;
  std::vector<int64_t> shape;
  void* data = nullptr;
  size_t capacity = 0;  // must be >= the region's bytes
};

// Told how many more tensor bytes (raw, as restored) were checked.
using VerifyProgress = std::function<void(uint64_t bytes)>;

class Reader {
 public:
  // Opens checkpoint `options.step` of `root`, or the newest committed one
  // whose manifest verifies. kNotFound if there is none; kDataLoss if the
  // named step's manifest or shard files are damaged.
  static absl::StatusOr<std::unique_ptr<Reader>> Open(const std::string& root,
                                                      const ReaderOptions& options);
  virtual ~Reader() = default;

  virtual int64_t step() const = 0;
  virtual const std::string& dir() const = 0;
  // How many ranks wrote the checkpoint (1 for a single-process one), and
  // the rank whose part this reader shows (-1: all of it).
  virtual int world_size() const = 0;
  virtual int rank() const = 0;
  // The extras object given to `Save`, as compact JSON text.
  virtual const std::string& extras_json() const = 0;
  virtual const std::vector<TensorInfo>& tensors() const = 0;
  // nullptr if there is no tensor `name`.
  virtual const TensorInfo* Find(absl::string_view name) const = 0;

  // Reads the named tensors into caller memory, many transfers in flight,
  // verifying each. Memory that is 4 KiB-aligned is filled directly by
  // O_DIRECT reads; other memory through the reader's buffers.
  // Targets whose `data` is the same address (tied weights: two names, one
  // storage) are filled once, by the first of them, provided the tensors
  // hold the same value (dtype, size and xxh3 equal); else kInvalidArgument
  // naming both, before anything is read. (Filling such memory once per
  // name would apply each delta to it once per name.)
  virtual absl::Status ReadInto(std::span<const ReadTarget> targets) = 0;
  // Reads a box of each named tensor into caller memory (a sharded tensor's
  // slice that this rank holds after resharding, say). Only what overlaps
  // the box is read: of a sharded tensor only the chunks that overlap it,
  // and of a record stored whole (not compressed, not a delta) only the
  // blocks of it that do, each checked against its own xxh3 (docs/format.md,
  // `block_xxh3`). Other records are read whole and checked. kInvalidArgument
  // for a box outside the tensor or a target too small. Targets into the same
  // `data` are filled once, as by `ReadInto`, when they are the same box of
  // tensors that hold the same value (else kInvalidArgument).
  virtual absl::Status ReadRegions(std::span<const RegionTarget> targets) = 0;
  // Bytes this reader has asked its shard files for so far (aligned reads
  // included): what the reads above cost.
  virtual uint64_t bytes_read() const = 0;
  // Reads one tensor into new memory.
  virtual absl::StatusOr<Tensor> Read(absl::string_view name) = 0;
  // Reads every tensor into new memory, in manifest order.
  virtual absl::StatusOr<std::vector<Tensor>> ReadAll() = 0;
  // Reads the named tensors into new memory, in the order given (a part of
  // the view: the tensors a rank reads for others too, say). The memory is
  // faulted in by other cores ahead of the reads, as for `ReadAll`.
  // kNotFound naming the first name the view lacks, before anything is read.
  virtual absl::StatusOr<std::vector<Tensor>> ReadNamed(std::span<const std::string> names) = 0;
  // Reads every record and checks every checksum without keeping the data;
  // a delta is rebuilt through its chain, checking each link's records it
  // uses. `progress` (may be null) is told the tensor bytes checked as it
  // goes (per read for whole records, per tensor for compressed ones and
  // deltas); when all is well they add up to the raw bytes of `tensors()`.
  // Returns the first failure: kDataLoss naming the shard and the tensor.
  virtual absl::Status Verify(const VerifyProgress& progress) = 0;
  absl::Status Verify() { return Verify(nullptr); }
};

}  // namespace ckpt

#endif  // CKPT_READER_H_
