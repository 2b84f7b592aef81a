// tools/restore_verify.cc: verifying one checkpoint tensor by tensor.
#include "restore_verify.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_format.h"
#include "ckpt/catalog.h"
#include "ckpt/file_system.h"
#include "ckpt/tensor.h"

namespace ckpt::tools {
namespace {

uint64_t AlignUp(uint64_t n) {
  return (n + kDirectIoAlignment - 1) / kDirectIoAlignment * kDirectIoAlignment;
}

}  // namespace

absl::Status VerifyTensors(Reader& reader, const std::function<void(uint64_t)>& progress,
                           const VerifyOptions& options) {
  const std::vector<TensorInfo>& tensors = reader.tensors();
  uint64_t largest = 0;
  uint64_t total = 0;
  for (const TensorInfo& t : tensors) {
    largest = std::max(largest, t.raw_bytes);
    total += t.raw_bytes;
  }
  // Without a progress report, or with a huge tensor, the library's own
  // Verify streams the checkpoint through bounded, registered buffers, and
  // overlaps hashing with reading: the fastest path, but all or nothing.
  if (!progress || largest > options.max_tensor_bytes) {
    absl::Status status = reader.Verify();
    if (status.ok() && progress) progress(total);
    return status;
  }
  // One buffer for a batch; every target starts 4 KiB-aligned, so that the
  // reader fills it by O_DIRECT reads without bouncing.
  const uint64_t capacity = std::max(AlignUp(largest), AlignUp(options.batch_bytes));
  absl::StatusOr<AlignedBytes> buffer = AlignedBytes::Allocate(capacity, /*prefault=*/false);
  if (!buffer.ok()) return buffer.status();
  char* const base = static_cast<char*>(buffer->data());
  std::vector<ReadTarget> batch;
  for (size_t next = 0; next < tensors.size();) {
    batch.clear();
    uint64_t used = 0;
    uint64_t bytes = 0;
    while (next < tensors.size() && (batch.empty() ||
                                     used + AlignUp(tensors[next].raw_bytes) <= capacity)) {
      const TensorInfo& t = tensors[next++];
      batch.push_back(ReadTarget{t.name, base + used, static_cast<size_t>(t.raw_bytes)});
      used += AlignUp(t.raw_bytes);
      bytes += t.raw_bytes;
    }
    absl::Status status = reader.ReadInto(batch);  // checks every checksum
    if (!status.ok()) return status;
    if (progress) progress(bytes);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Reader>> OpenStep(const std::string& root, int64_t step) {
  ReaderOptions options;
  options.step = step;
  absl::StatusOr<std::unique_ptr<Reader>> reader = Reader::Open(root, options);
  if (!reader.ok()) return reader.status();
  if ((*reader)->step() != step) {
    return absl::InternalError(
        absl::StrFormat("asked for step %d, the reader opened step %d", step, (*reader)->step()));
  }
  return reader;
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
  if (status.ok()) {
    status = bar.enabled() ? VerifyTensors(**reader, count) : VerifyTensors(**reader, nullptr);
  }
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
