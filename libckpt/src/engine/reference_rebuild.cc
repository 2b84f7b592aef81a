#include "engine/reference_rebuild.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ckpt/catalog.h"
#include "ckpt/reader.h"
#include "read/delta_chain.h"
#include "util/status_macros.h"

namespace ckpt::internal {
namespace {

// Tensors are read in batches of about this many bytes, so that a cancelled
// rebuild stops soon.
constexpr uint64_t kBatchBytes = uint64_t{256} << 20;

}  // namespace

absl::StatusOr<std::optional<int64_t>> RebuildReference(std::shared_ptr<FileSystem> fs,
                                                        const std::string& root,
                                                        const IoOptions& io, bool differential,
                                                        ReferenceState* reference,
                                                        const std::function<bool()>& cancelled) {
  reference->Invalidate();
  ReaderOptions options;
  options.fs = fs;
  options.io = io;
  absl::StatusOr<std::unique_ptr<Reader>> newest = Reader::Open(root, options);
  if (absl::IsNotFound(newest.status())) return std::optional<int64_t>();
  CKPT_RETURN_IF_ERROR(newest.status());
  if ((*newest)->world_size() > 1) return std::optional<int64_t>();
  CKPT_ASSIGN_OR_RETURN(DeltaChain chain, DeltaChain::Load(*fs, root, (*newest)->step()));
  const ChainLink& base = differential ? chain.link(0) : chain.opened();
  std::unique_ptr<Reader> reader = std::move(*newest);
  if (base.manifest.step != reader->step()) {
    options.step = base.manifest.step;
    CKPT_ASSIGN_OR_RETURN(reader, Reader::Open(root, options));
  }
  std::vector<ReadTarget> batch;
  uint64_t batch_bytes = 0;
  auto flush = [&]() -> absl::Status {
    if (cancelled()) return absl::CancelledError("engine closing");
    CKPT_RETURN_IF_ERROR(reader->ReadInto(batch));
    batch.clear();
    batch_bytes = 0;
    return absl::OkStatus();
  };
  for (const TensorInfo& t : reader->tensors()) {
    char* dst = reference->FindOrCreate(t.name, t.dtype, t.shape, t.raw_bytes);
    if (dst == nullptr) continue;  // over the budget: saved whole, as it would be anyway
    batch.push_back(ReadTarget{t.name, dst, t.raw_bytes});
    batch_bytes += t.raw_bytes;
    if (batch_bytes >= kBatchBytes) CKPT_RETURN_IF_ERROR(flush());
  }
  if (!batch.empty()) CKPT_RETURN_IF_ERROR(flush());
  uint64_t chain_bytes = 0;
  for (size_t l = 0; l < chain.size(); ++l) chain_bytes += chain.link(l).manifest.shard_bytes();
  // Saves since the full one (for `full_every`): the chain's deltas, or, for
  // differential deltas (each applies to the full save alone), every
  // checkpoint after the full one up to the newest.
  int deltas = static_cast<int>(chain.size()) - 1;
  if (differential) {
    CKPT_ASSIGN_OR_RETURN(std::vector<int64_t> steps, ListSteps(root, fs));
    deltas = static_cast<int>(std::count_if(steps.begin(), steps.end(), [&](int64_t s) {
      return s > chain.link(0).manifest.step && s <= chain.opened().manifest.step;
    }));
  }
  reference->Restored(base.manifest.step, base.manifest.manifest_xxh3, deltas,
                      chain.link(0).manifest.shard_bytes(),
                      chain_bytes, chain.is_delta() ? chain.opened().manifest.shard_bytes() : 0);
  return std::optional<int64_t>(base.manifest.step);
}

}  // namespace ckpt::internal
