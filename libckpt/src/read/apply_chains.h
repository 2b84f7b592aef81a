// `ChainApplier`: brings many tensors forward along their delta chains at
// once, at a cost proportional to the bytes stored: the payloads of every
// link of every tensor are read in parallel through the shard files' I/O
// queue into a reused arena (later batches are read while earlier ones are
// applied), each link is checked once by the checksum of its stored bytes
// (`TensorInfo::stored_xxh3`), the links of a tensor are applied oldest
// first in one pass on the decode pool, and the reconstructed value is
// checked once, at the end, against the opened link's `xxh3`. The base
// values can be read by the same pipeline (`ReadBases`): each just before the
// batch holding its tensor's first link, so that the disk reads bases and
// links while the cores apply the batches already read.
//
// Links written before `stored_xxh3` existed are checked as they always
// were: the value after each is hashed. When a tensor's final check fails
// although each link's stored bytes matched, the tensor is rebuilt link by
// link (`ApplyDeltas`), so that the error names the link that is wrong.
#ifndef CKPT_READ_APPLY_CHAINS_H_
#define CKPT_READ_APPLY_CHAINS_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "ckpt/options.h"
#include "ckpt/tensor.h"
#include "read/delta_chain.h"
#include "read/shard_files.h"
#include "util/scratch_bytes.h"

namespace ckpt::internal {

// One tensor to bring forward from link `base` of `chain` (where it is
// stored whole) to the chain's opened link.
struct ChainTarget {
  const DeltaChain* chain = nullptr;
  const std::string* name = nullptr;  // its name in `chain`
  size_t base = 0;                    // REQUIRES: base + 1 < chain->size()
  char* dst = nullptr;                // holds its (checked) value at `base`
};

class ChainApplier {
 public:
  // Reads links into an arena of at most twice `io.buffer_bytes` (or twice
  // the largest link, when larger, up to 1 GiB; past that, the largest link
  // once), reused from call to call: in batches of up to a quarter of it (a
  // larger link is a batch of its own), read on a thread of their own while
  // the caller applies those already read.
  explicit ChainApplier(const IoOptions& io);

  // Puts the base values of the given `targets` into their `dst`s and checks
  // them. Called on the thread reading the links, between batches (it may
  // drive `files.queue()` itself; no batch is being read meanwhile).
  using ReadBases = std::function<absl::Status(std::span<const size_t> targets)>;

  // Applies every delta link of each of `targets` to its `dst`, after
  // `read_bases` filled its base value (null: the `dst`s hold them already).
  // `read_bases` is also how a tensor is read again before it is rebuilt link
  // by link (when it is null, nothing can be: the mismatch is the error). Errors are
  // kDataLoss naming the tensor and the link (its checkpoint directory,
  // shard and offset): stored bytes that do not match their `stored_xxh3`,
  // a malformed payload, a value that does not match its `xxh3`. I/O errors
  // are returned as they come. On error, `dst`s hold partial values.
  // REQUIRES: nothing else drives `files.queue()` during the call.
  absl::Status Apply(ShardFiles& files, std::span<const ChainTarget> targets, const ReadBases& read_bases);

 private:
  const uint64_t arena_budget_;
  ScratchBytes arena_;
};

}  // namespace ckpt::internal

#endif  // CKPT_READ_APPLY_CHAINS_H_
