// tools/restore/verify.cc: verifying checkpoints with a progress bar.
#include "restore/verify.h"

#include <algorithm>

#include "ckpt/catalog.h"

namespace ckpt::tools {

absl::StatusOr<std::unique_ptr<Reader>> OpenStep(const std::string& root, int64_t step,
                                                 std::optional<int> rank) {
  ReaderOptions options;
  options.step = step;
  options.rank = rank;
  return Reader::Open(root, options);
}

absl::StatusOr<std::unique_ptr<Reader>> VerifyStep(const std::string& root, int64_t step,
                                                   ProgressBar& bar, uint64_t budget) {
  uint64_t counted = 0;
  auto count = [&](uint64_t bytes) {
    bytes = std::min(bytes, budget - counted);
    counted += bytes;
    bar.Add(bytes);
  };
  absl::StatusOr<std::unique_ptr<Reader>> reader = OpenStep(root, step);
  absl::Status status = reader.status();
  if (status.ok()) status = (*reader)->Verify(bar.enabled() ? VerifyProgress(count) : nullptr);
  count(budget - counted);
  if (!status.ok()) return status;
  return reader;
}

std::map<int64_t, uint64_t> TensorBytesByStep(const std::string& root, const ProgressBar& bar) {
  std::map<int64_t, uint64_t> bytes;
  if (!bar.enabled()) return bytes;
  absl::StatusOr<std::vector<CheckpointSummary>> summaries = ListCheckpoints(root);
  if (!summaries.ok()) return bytes;
  for (const CheckpointSummary& s : *summaries) bytes[s.step] = s.tensor_bytes;
  return bytes;
}

}  // namespace ckpt::tools
