#include "distributed/rank_layout.h"

#include <algorithm>
#include <cstdio>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "format/names.h"
#include "util/hash.h"

namespace ckpt::internal {
std::vector<int> TensorOwners(std::span<const TensorView> tensors, int rank, int world_size) {
  std::vector<int> owners(tensors.size(), rank);
  std::vector<size_t> replicated;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].placement == TensorPlacement::kReplicated) replicated.push_back(i);
  }
  std::sort(replicated.begin(), replicated.end(), [&](size_t a, size_t b) {
    return std::forward_as_tuple(tensors[b].nbytes, tensors[a].name) <
           std::forward_as_tuple(tensors[a].nbytes, tensors[b].name);
  });
  std::vector<uint64_t> load(std::max(1, world_size), 0);
  for (size_t i : replicated) {
    const int owner = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    owners[i] = owner;
    load[owner] += tensors[i].nbytes;
  }
  return owners;
}

uint64_t ReplicatedFingerprint(std::span<const TensorView> tensors) {
  std::vector<std::string> entries;
  for (const TensorView& t : tensors) {
    if (t.placement != TensorPlacement::kReplicated) continue;
    std::string e = absl::StrCat(t.name.size(), ":", t.name, ":", static_cast<int>(t.dtype), ":");
    for (int64_t d : t.shape) absl::StrAppend(&e, d, ",");
    entries.push_back(std::move(e));
  }
  std::sort(entries.begin(), entries.end());
  std::string all;
  for (const std::string& e : entries) absl::StrAppend(&all, e, ";");
  return Xxh3(all.data(), all.size());
}

}  // namespace ckpt::internal
