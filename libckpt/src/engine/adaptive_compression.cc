#include "engine/adaptive_compression.h"

namespace ckpt::internal {
namespace {

// Weight of a new measurement in the running estimates.
constexpr double kNewWeight = 0.3;
// Writes shorter than this say little about the disk.
constexpr double kMinBusySeconds = 0.005;
// Compressing must be this much faster than the disk to be chosen: the
// encoder's own copy and the scheduler's noise cost a few percent.
constexpr double kMargin = 1.05;

double Blend(double old_value, double sample) {
  return old_value == 0 ? sample : (1 - kNewWeight) * old_value + kNewWeight * sample;
}

}  // namespace

void AdaptiveCompression::BeginSave(size_t tensors) {
  refused_.assign(tensors, false);
  save_bytes_ = 0;
  save_busy_s_ = 0;
}

double AdaptiveCompression::write_bytes_per_s() const {
  if (save_busy_s_ >= kMinBusySeconds) {
    const double now = save_bytes_ / save_busy_s_;
    return write_rate_ == 0 ? now : (1 - kNewWeight) * write_rate_ + kNewWeight * now;
  }
  return write_rate_;
}

bool AdaptiveCompression::CompressGroup() {
  bool compress = true;
  if (enabled_) {
    const double write = write_bytes_per_s();
    // Unmeasured either way: compress (and so measure E).
    if (encode_rate_ > 0 && write > 0) compress = encode_rate_ >= kMargin * write;
    if (!compress && ++groups_since_sample_ >= kSampleEvery) {
      groups_since_sample_ = 0;
      compress = true;
    }
  }
  ++(compress ? compressed_groups_ : raw_groups_);
  return compress;
}

void AdaptiveCompression::Block(size_t tensor, uint64_t in, uint64_t out) {
  if (tensor < refused_.size() && static_cast<double>(out) > kWorthwhile * static_cast<double>(in)) {
    refused_[tensor] = true;
  }
}

void AdaptiveCompression::Encoded(uint64_t in, double seconds) {
  if (seconds <= 0 || in == 0) return;
  encode_rate_ = Blend(encode_rate_, in / seconds);
}

void AdaptiveCompression::Written(uint64_t bytes, double busy_seconds) {
  save_bytes_ = bytes;
  save_busy_s_ = busy_seconds;
}

void AdaptiveCompression::EndSave() {
  if (save_busy_s_ >= kMinBusySeconds) write_rate_ = Blend(write_rate_, save_bytes_ / save_busy_s_);
  save_bytes_ = 0;
  save_busy_s_ = 0;
}

}  // namespace ckpt::internal
