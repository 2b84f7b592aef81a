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
    CKPT_ASSIGN_OR_RETURN(std::vector<const TensorInfo*> records,
                          DeltaLinksOf(*target.chain, *target.name, target.base));
    for (size_t k = 0; k < records.size(); ++k) links.push_back(LinkRead{i, target.base + 1 + k, records[k]});
  }
  if (links.empty()) return absl::OkStatus();
  WorkerPool* pool = files.codec_pool();
  std::vector<char> damaged(targets.size(), 0);  // (not vector<bool>: set from several threads)
  // Batches: links in order, up to the budget each (a target's links stay
  // in order across batches, which are applied one after another). Two
  // halves of one buffer alternate: batch b + 1 is read while batch b is
  // applied.
  struct Batch {
    size_t begin, end;
    uint64_t bytes;
  };
  std::vector<Batch> batches;
  uint64_t largest = 0;
  for (size_t begin = 0; begin < links.size();) {
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
    batches.push_back(Batch{begin, end, bytes});
    largest = std::max(largest, bytes);
    begin = end;
  }
  const uint64_t half = AlignUp(largest, kDirectIoAlignment);
  CKPT_ASSIGN_OR_RETURN(char* memory, files.ScratchBytes(batches.size() > 1 ? 2 * half : half));
  auto buffer_of = [&](size_t b) { return memory + (b % 2) * half; };
  IoExecutor io(files.queue(), files.io().chunk_bytes);
  std::vector<char> read_done(links.size(), 0);
  auto start = [&](size_t b) -> absl::Status {
    for (size_t r = batches[b].begin; r < batches[b].end; ++r) {
      const LinkRead& link = links[r];
      File* file = *files.Get(targets[link.target].chain->link(link.link).dir, link.info->shard);
      files.CountRead(link.length);
      CKPT_RETURN_IF_ERROR(io.Start(IoOp::Kind::kRead, file, link.info->offset, buffer_of(b) + link.at,
                                    link.length, r, -1, link.info->stored_bytes));
    }
    return absl::OkStatus();
  };
  auto wait = [&](size_t b) -> absl::Status {
    std::vector<uint64_t> finished;
    for (size_t r = batches[b].begin; r < batches[b].end; ++r) {
      while (!read_done[r]) {
        finished.clear();
        CKPT_RETURN_IF_ERROR(io.Poll(/*block=*/true, &finished));
        for (uint64_t tag : finished) read_done[tag] = 1;
      }
    }
    return io.status();
  };
  absl::Status status = start(0);
  for (size_t b = 0; b < batches.size() && status.ok(); ++b) {
    if (b + 1 < batches.size()) status = start(b + 1);
    if (status.ok()) status = wait(b);
    if (!status.ok()) break;
    char* buffer = buffer_of(b);
    const size_t begin = batches[b].begin, end = batches[b].end;
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
  }
  absl::Status drained = io.Drain();
  CKPT_RETURN_IF_ERROR(status);
  CKPT_RETURN_IF_ERROR(drained);
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
