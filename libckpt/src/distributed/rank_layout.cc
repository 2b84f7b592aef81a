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
namespace {

constexpr absl::string_view kRankPrefix = "rank-";
constexpr absl::string_view kRankManifestSuffix = ".MANIFEST.json";

}  // namespace

std::string RankManifestName(int rank) {
  return absl::StrFormat("%s%05d%s", kRankPrefix, rank, kRankManifestSuffix);
}

std::optional<int> ParseRankManifestName(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, kRankPrefix) || !absl::ConsumeSuffix(&name, kRankManifestSuffix) ||
      name.size() != 5) {
    return std::nullopt;
  }
  int rank = 0;
  for (char c : name) {
    if (c < '0' || c > '9') return std::nullopt;
    rank = rank * 10 + (c - '0');
  }
  return rank;
}

std::string RankFilePrefix(int rank) { return absl::StrFormat("%s%05d.", kRankPrefix, rank); }

std::string MultiRankTempDirName(int64_t step, absl::string_view nonce, int attempt) {
  return absl::StrFormat("%sstep-%020d-%s-%d", kTempPrefix, step, nonce, attempt);
}

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
