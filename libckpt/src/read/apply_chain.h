// Bringing many tensors forward along their delta chains at once: the
// stored deltas of every link are read in parallel (a batch at a time, into
// one reused buffer), applied oldest first on the decode pool, and each
// tensor's reconstruction is checked once, against the checksum the opened
// step records for it. Only when that check fails is a tensor rebuilt link
// by link, checking after each, to name the damaged link.
//
// Why one check is enough: every link's record is an exact function of its
// stored bytes, so a reconstruction that hashes to the opened step's value
// used sound links (to the strength of XXH3-64), and one that does not is
// re-applied link by link to say where it went wrong.
#ifndef CKPT_READ_APPLY_CHAIN_H_
#define CKPT_READ_APPLY_CHAIN_H_

#include <functional>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "read/delta_chain.h"
#include "read/shard_files.h"

namespace ckpt::internal {

// A tensor whose value at link `base` of `chain` is in `dst` (raw_bytes of
// room), to be brought to the chain's opened link.
struct ChainTarget {
  const DeltaChain* chain = nullptr;
  const std::string* name = nullptr;
  size_t base = 0;
  char* dst = nullptr;
};

// Applies every target's deltas. `reload(i)` puts target i's base value
// back into its `dst` (for the link-by-link re-check). kDataLoss naming the
// tensor, shard, offset and step of the first damaged link.
absl::Status ApplyChains(ShardFiles& files, std::span<const ChainTarget> targets,
                         const std::function<absl::Status(size_t)>& reload);

}  // namespace ckpt::internal

#endif  // CKPT_READ_APPLY_CHAIN_H_
