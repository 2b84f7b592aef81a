// `AdaptiveCompression`: decides whether compressing full saves pays, from
// what saves actually took (the rule of `CompressionOptions::adaptive`,
// docs/engine.md "Compression of full saves").
//
// What a user asks of compression is smaller checkpoints without slower
// ones. Whether compression makes a durable save slower depends on the
// codec's throughput on the cores it gets against the disk's: compressing
// to a fraction c costs about max(B / E, c B / W) against B / W raw. Rather
// than model E and W (a disk behind a host cache, a network file system and
// a CPU shared with a training loop all defy models), the rule measures the
// quantity itself: the tensor bytes per second of persist time of
// compressed saves and of raw ones (a running estimate of each). A save is
// compressed while that is at least `kSlack` of the raw rate (compression
// within a few percent is worth its bytes), and raw otherwise; one save in
// `kResampleEvery` takes the other way, so that both estimates follow a
// disk or a CPU load that changes. The first save is compressed and the
// second raw, to measure both. Within a compressed save, a tensor one of
// whose blocks does not shrink below `kWorthwhile` of its size is stored
// raw for the rest of the save.
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
  // Compressed saves may persist this much slower than raw ones (their
  // bytes are worth it).
  static constexpr double kSlack = 0.97;
  // One save in this many takes the way not chosen.
  static constexpr int kResampleEvery = 32;

  // `enabled` false: every save, and every block, is compressed.
  explicit AdaptiveCompression(bool enabled) : enabled_(enabled) {}

  // Whether the next full save is compressed.
  bool CompressSave();
  // A full save of `tensors` tensors begins (compressed: per-tensor refusals).
  void BeginSave(size_t tensors);
  // Whether a block of tensor `tensor` (its index in the save) may be
  // compressed: false once one of its blocks did not shrink.
  bool TensorWorthwhile(size_t tensor) const {
    return !enabled_ || tensor >= refused_.size() || !refused_[tensor];
  }
  // A compressed block of `tensor`: `in` bytes became `out`.
  void Block(size_t tensor, uint64_t in, uint64_t out);
  // A full save committed: `bytes` of tensors persisted in `seconds`.
  void Saved(bool compressed, uint64_t bytes, double seconds);

  double compressed_bytes_per_s() const { return rate_[1]; }
  double raw_bytes_per_s() const { return rate_[0]; }

 private:
  const bool enabled_;
  double rate_[2] = {0, 0};  // raw, compressed; 0: not measured
  int saves_ = 0;
  std::vector<bool> refused_;  // per tensor of this save
};

}  // namespace ckpt::internal

#endif  // CKPT_ENGINE_ADAPTIVE_COMPRESSION_H_
