#include "read/apply_chain.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "delta/delta_codec.h"
#include "format/names.h"
#include "io/io_executor.h"
#include "read/decode_record.h"
#include "util/hash.h"
#include "util/status_macros.h"

namespace ckpt::internal {
namespace {

// Stored deltas read at once, at most (a larger single one is read alone).
constexpr uint64_t kBatchBytes = uint64_t{16} << 20;

// One delta record to read and apply.
struct LinkRead {
  size_t target;
  size_t link;
  const TensorInfo* info;
  uint64_t at = 0;      // offset in the batch buffer
  uint64_t length = 0;  // bytes read (the stored bytes, rounded up for O_DIRECT)
};

}  // namespace

absl::Status ApplyChains(ShardFiles& files, std::span<const ChainTarget> targets,
                         const std::function<absl::Status(size_t)>& reload) {
  std::vector<LinkRead> links;
  for (size_t i = 0; i < targets.size(); ++i) {
    const ChainTarget& target = targets[i];
    const DeltaChain& chain = *target.chain;
    const TensorInfo* first = chain.Find(target.base, *target.name);
    for (size_t l = target.base + 1; l < chain.size(); ++l) {
      const TensorInfo* t = chain.Find(l, *target.name);
      if (t == nullptr || first == nullptr || t->dtype != first->dtype || t->shape != first->shape) {
        return absl::DataLossError(absl::StrCat("tensor \"", *target.name,
                                                "\" changes dtype or shape along the delta chain of ",
                                                chain.opened().dir));
      }
      links.push_back(LinkRead{i, l, t});
    }
  }
  if (links.empty()) return absl::OkStatus();
  WorkerPool* pool = files.codec_pool();
  std::vector<char> damaged(targets.size(), 0);  // (not vector<bool>: set from several threads)
  for (size_t begin = 0; begin < links.size();) {
    // A batch: links in order, up to the budget (a target's links stay in
    // order across batches, which run one after another).
    size_t end = begin;
    uint64_t bytes = 0;
    for (; end < links.size(); ++end) {
      LinkRead& link = links[end];
      CKPT_ASSIGN_OR_RETURN(File * file, files.Get(targets[link.target].chain->link(link.link).dir,
                                                   link.info->shard));
      link.length = file->direct() ? AlignUp(link.info->stored_bytes, kDirectIoAlignment)
                                   : link.info->stored_bytes;
      if (end > begin && bytes + link.length > kBatchBytes) break;
      link.at = bytes;
      bytes = AlignUp(bytes + link.length, kDirectIoAlignment);
    }
    CKPT_ASSIGN_OR_RETURN(char* buffer, files.ScratchBytes(bytes));
    {
      IoExecutor io(files.queue(), files.io().chunk_bytes);
      absl::Status started;
      for (size_t r = begin; r < end && started.ok(); ++r) {
        const LinkRead& link = links[r];
        File* file = *files.Get(targets[link.target].chain->link(link.link).dir, link.info->shard);
        files.CountRead(link.length);
        started = io.Start(IoOp::Kind::kRead, file, link.info->offset, buffer + link.at, link.length, r,
                           -1, link.info->stored_bytes);
      }
      absl::Status drained = io.Drain();
      CKPT_RETURN_IF_ERROR(started);
      CKPT_RETURN_IF_ERROR(drained);
    }
    // Apply, per target in link order: across targets on the pool when
    // there are many, else one at a time with the pool inside each record.
    std::vector<std::pair<size_t, size_t>> runs;  // [first, last) of links per target
    for (size_t r = begin; r < end;) {
      size_t e = r + 1;
      while (e < end && links[e].target == links[r].target) ++e;
      runs.emplace_back(r, e);
      r = e;
    }
    std::vector<absl::Status> results(runs.size());
    auto apply_run = [&](size_t k, WorkerPool* inner) {
      for (size_t r = runs[k].first; r < runs[k].second && results[k].ok(); ++r) {
        const LinkRead& link = links[r];
        const TensorInfo& t = *link.info;
        if (damaged[link.target]) break;
        absl::Status applied = ApplyDelta(t.encoding, buffer + link.at, t.stored_bytes,
                                          targets[link.target].dst, t.raw_bytes, t.dtype, inner);
        if (!applied.ok()) damaged[link.target] = 1;  // named by the re-check below
      }
    };
    if (runs.size() >= 2 * static_cast<size_t>(pool->threads())) {
      pool->ParallelFor(runs.size(), [&](size_t k) { apply_run(k, nullptr); });
    } else {
      for (size_t k = 0; k < runs.size(); ++k) apply_run(k, pool);
    }
    begin = end;
  }
  // One check per tensor, of what the opened step records.
  std::vector<size_t> order;
  for (size_t i = 0; i < targets.size(); ++i) {
    if (targets[i].base + 1 < targets[i].chain->size()) order.push_back(i);
  }
  pool->ParallelFor(order.size(), [&](size_t k) {
    const ChainTarget& target = targets[order[k]];
    const TensorInfo* t = target.chain->Find(target.chain->size() - 1, *target.name);
    if (damaged[order[k]] || Xxh3(target.dst, t->raw_bytes) != t->xxh3) damaged[order[k]] = 1;
  });
  for (size_t i : order) {
    if (!damaged[i]) continue;
    // Link by link, to name the damaged one.
    // (ApplyDeltas checks after every link, the last one included: if it
    // passes, what failed before was not in the files.)
    CKPT_RETURN_IF_ERROR(reload(i));
    CKPT_RETURN_IF_ERROR(ApplyDeltas(files, *targets[i].chain, *targets[i].name, targets[i].base, targets[i].dst));
  }
  return absl::OkStatus();
}

}  // namespace ckpt::internal
