#include "engine/adaptive_compression.h"

namespace ckpt::internal {
namespace {

// Weight of a new measurement in the running estimates.
constexpr double kNewWeight = 0.3;

}  // namespace

bool AdaptiveCompression::CompressSave() {
  if (!enabled_) return true;
  ++saves_;
  if (rate_[1] == 0) return true;   // measure the codec first
  if (rate_[0] == 0) return false;  // then the disk alone
  const bool compress = rate_[1] >= kSlack * rate_[0];
  return saves_ % kResampleEvery == 0 ? !compress : compress;
}

void AdaptiveCompression::BeginSave(size_t tensors) { refused_.assign(tensors, false); }

void AdaptiveCompression::Block(size_t tensor, uint64_t in, uint64_t out) {
  if (tensor < refused_.size() && static_cast<double>(out) > kWorthwhile * static_cast<double>(in)) {
    refused_[tensor] = true;
  }
}

void AdaptiveCompression::Saved(bool compressed, uint64_t bytes, double seconds) {
  if (seconds <= 0 || bytes == 0) return;
  double& rate = rate_[compressed ? 1 : 0];
  const double sample = bytes / seconds;
  rate = rate == 0 ? sample : (1 - kNewWeight) * rate + kNewWeight * sample;
}

}  // namespace ckpt::internal
