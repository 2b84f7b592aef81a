// `DeltaChain`: the checkpoints a reader needs to restore one step — that
// step and, when it is a delta, every base back to a full checkpoint.
#ifndef CKPT_READ_DELTA_CHAIN_H_
#define CKPT_READ_DELTA_CHAIN_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ckpt/file_system.h"
#include "ckpt/reader.h"
#include "format/manifest.h"
#include "format/names.h"

namespace ckpt::internal {

// One checkpoint of a delta chain.
struct ChainLink {
  std::string dir;
  Manifest manifest;
  std::map<std::string, size_t> index;  // tensor name -> position in `manifest.tensors`
};

class DeltaChain {
 public:
  // Loads checkpoint `step` of `root` and, for a delta, every base down to a
  // full checkpoint, checking each base against the manifest checksum its
  // dependant recorded (a base rewritten by compaction matches too). A
  // missing, damaged or mismatched base is kDataLoss naming both steps.
  // With `rank`, the chain of that rank's part of a multi-rank checkpoint,
  // whose bases are the same rank's parts of the base steps (each checked
  // against its step manifest, as `LoadRankPart` does).
  // `head`, when given, is step `step`'s manifest (or rank part) as the
  // caller already loaded and checked it: it is not read again.
  static absl::StatusOr<DeltaChain> Load(FileSystem& fs, const std::string& root, int64_t step,
                                         std::optional<int> rank = std::nullopt,
                                         std::optional<Manifest> head = std::nullopt);

  // Links run from the full checkpoint (0) to the one opened (`size() - 1`).
  size_t size() const { return links_.size(); }
  bool is_delta() const { return links_.size() > 1; }
  const ChainLink& link(size_t i) const { return links_[i]; }
  const ChainLink& opened() const { return links_.back(); }

  // Tensor `name` of link `link`; nullptr if that checkpoint has none.
  const TensorInfo* Find(size_t link, absl::string_view name) const;
  // The newest link at or before the opened one that stores `name` whole
  // (not as a delta): where its reconstruction starts. kDataLoss if the
  // chain breaks off before one.
  absl::StatusOr<size_t> BaseLinkOf(absl::string_view name) const;

 private:
  explicit DeltaChain(std::vector<ChainLink> links) : links_(std::move(links)) {}

  std::vector<ChainLink> links_;
};

}  // namespace ckpt::internal

#endif  // CKPT_READ_DELTA_CHAIN_H_
