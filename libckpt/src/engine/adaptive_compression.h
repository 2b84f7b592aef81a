// `AdaptiveCompression`: decides, block by block, whether compressing a full
// record's bytes pays, from throughputs measured while saving (the rule of
// `CompressionOptions::adaptive`, docs/engine.md "Compression").
//
// A save's durable time is bounded by the slower of encoding and writing.
// Writing raw costs B / W (W: the disk's write throughput); compressing to
// a fraction c costs max(B / E, c B / W) with the encoding (throughput E,
// all encoder threads) overlapping the writes. For c < 1 compressing is
// faster exactly when E > W, and it saves bytes either way; so a block is
// compressed while the measured E is at least W (with a margin), and stored
// raw otherwise. A tensor whose blocks do not shrink below `kWorthwhile` of
// their size is stored raw for the rest of the save. Raw blocks leave E
// unmeasured, so one group in `kSampleEvery` is compressed regardless: both
// estimates follow a disk or a CPU load that changes.
//
// Owned by the persister thread; its estimates carry over from save to save.
#ifndef CKPT_ENGINE_ADAPTIVE_COMPRESSION_H_
#define CKPT_ENGINE_ADAPTIVE_COMPRESSION_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ckpt::internal {

class AdaptiveCompression {
 public:
  // A block that compresses to more than this fraction is not worth it.
  static constexpr double kWorthwhile = 0.95;
  // Every this many groups is compressed, even when raw is chosen.
  static constexpr int kSampleEvery = 8;

  // `enabled` false: every block is compressed (`CompressionOptions::adaptive`).
  explicit AdaptiveCompression(bool enabled) : enabled_(enabled) {}

  // A new save of `tensors` tensors begins.
  void BeginSave(size_t tensors);
  // Whether the next group of blocks is compressed (false: raw), before
  // per-tensor refusals.
  bool CompressGroup();
  // Whether a block of tensor `tensor` (its index in the save) may be
  // compressed: false once one of its blocks did not shrink.
  bool TensorWorthwhile(size_t tensor) const {
    return !enabled_ || tensor >= refused_.size() || !refused_[tensor];
  }
  // A compressed block of `tensor`: `in` bytes became `out`.
  void Block(size_t tensor, uint64_t in, uint64_t out);
  // A group of compressed blocks took `seconds` of wall time for `in` bytes.
  void Encoded(uint64_t in, double seconds);
  // Writes of this save so far: `bytes` in `busy_seconds` with at least one
  // write in flight.
  void Written(uint64_t bytes, double busy_seconds);
  // The save ended: its write figures join the estimate.
  void EndSave();

  double encode_bytes_per_s() const { return encode_rate_; }
  double write_bytes_per_s() const;
  uint64_t compressed_groups() const { return compressed_groups_; }
  uint64_t raw_groups() const { return raw_groups_; }

 private:
  const bool enabled_;
  double encode_rate_ = 0;      // EMA, bytes/s; 0: not measured yet
  double write_rate_ = 0;       // of earlier saves, bytes/s; 0: none
  uint64_t save_bytes_ = 0;     // this save's writes so far
  double save_busy_s_ = 0;
  int groups_since_sample_ = 0;
  std::vector<bool> refused_;   // per tensor of this save
  uint64_t compressed_groups_ = 0;
  uint64_t raw_groups_ = 0;
};

}  // namespace ckpt::internal

#endif  // CKPT_ENGINE_ADAPTIVE_COMPRESSION_H_
