#include "read/delta_chain.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "delta/delta_codec.h"
#include "format/names.h"
#include "read/load_manifest.h"
#include "util/hash.h"

namespace ckpt::internal {
namespace {

// Longer chains are taken for a cycle or a damaged manifest.
constexpr size_t kMaxChainLength = 100000;

}  // namespace

absl::StatusOr<DeltaChain> DeltaChain::Load(FileSystem& fs, const std::string& root,
                                            int64_t step, std::optional<int> rank,
                                            std::optional<Manifest> head) {
  std::vector<ChainLink> chain;
  int64_t next = step;
  uint64_t expected_hash = 0;
  bool check_hash = false;
  while (true) {
    const std::string dir = JoinPath(root, CheckpointDirName(next));
    absl::StatusOr<Manifest> manifest = chain.empty() && head.has_value() ? std::move(*head)
                                        : rank.has_value() ? LoadRankPart(fs, dir, next, *rank)
                                                           : LoadManifest(fs, dir, next);
    if (!manifest.ok()) {
      if (!chain.empty() && (manifest.status().code() == absl::StatusCode::kDataLoss ||
                             !fs.Stat(dir).ok())) {
        return absl::DataLossError(absl::StrCat("base checkpoint step ", next, " of delta step ",
                                                chain.back().manifest.step, " is missing or damaged: ",
                                                manifest.status().message()));
      }
      return manifest.status();
    }
    // A base rewritten by compaction still matches: it names the checksum
    // of the delta it replaced (its values are the same).
    if (check_hash && !manifest->MatchesBaseHash(expected_hash)) {
      return absl::DataLossError(absl::StrCat(
          "base checkpoint step ", next, " of delta step ", chain.back().manifest.step,
          " is not the one the delta was written against (manifest checksum ",
          HashToHex(manifest->manifest_xxh3), ", expected ", HashToHex(expected_hash), ")"));
    }
    const bool delta = manifest->kind == CheckpointKind::kDelta;
    const int64_t base = manifest->base_step;
    expected_hash = manifest->base_manifest_xxh3;
    chain.push_back(ChainLink{dir, std::move(*manifest), {}});
    if (!delta) break;
    if (chain.size() >= kMaxChainLength) {
      return absl::DataLossError(absl::StrCat("delta chain of step ", step, " is too long"));
    }
    next = base;
    check_hash = true;
  }
  std::reverse(chain.begin(), chain.end());
  for (ChainLink& link : chain) {
    for (size_t i = 0; i < link.manifest.tensors.size(); ++i) {
      link.index[link.manifest.tensors[i].name] = i;
    }
  }
  // A delta record applies to the same tensor of the link before it: same
  // dtype, shape and size, down to a whole record, whose size the parser
  // bounded by its shard. Checked here, before a reader sizes any buffer by
  // a delta's declared shape (a hostile manifest could declare any).
  for (size_t l = 1; l < chain.size(); ++l) {
    for (const TensorInfo& t : chain[l].manifest.tensors) {
      if (!IsDeltaEncoding(t.encoding)) continue;
      auto it = chain[l - 1].index.find(t.name);
      const TensorInfo* base = it == chain[l - 1].index.end() ? nullptr
                                                              : &chain[l - 1].manifest.tensors[it->second];
      if (base == nullptr || base->dtype != t.dtype || base->shape != t.shape ||
          base->raw_bytes != t.raw_bytes) {
        return absl::DataLossError(absl::StrCat(
            "tensor \"", t.name, "\" of delta step ", chain[l].manifest.step, " (", chain[l].dir,
            ") is a delta of step ", chain[l - 1].manifest.step,
            base == nullptr ? ", which has no such tensor"
                            : ", whose tensor of that name has another dtype, shape or size"));
      }
    }
  }
  return DeltaChain(std::move(chain));
}

const TensorInfo* DeltaChain::Find(size_t link, absl::string_view name) const {
  const ChainLink& l = links_[link];
  auto it = l.index.find(std::string(name));
  return it == l.index.end() ? nullptr : &l.manifest.tensors[it->second];
}

absl::StatusOr<size_t> DeltaChain::BaseLinkOf(absl::string_view name) const {
  for (size_t l = links_.size(); l > 0; --l) {
    const TensorInfo* t = Find(l - 1, name);
    if (t == nullptr) break;
    if (!IsDeltaEncoding(t->encoding)) return l - 1;
  }
  return absl::DataLossError(absl::StrCat("tensor \"", name, "\" of ", opened().dir,
                                          " has no whole record in its delta chain"));
}

}  // namespace ckpt::internal
