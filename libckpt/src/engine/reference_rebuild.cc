#include "engine/reference_rebuild.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ckpt/catalog.h"
#include "ckpt/reader.h"
#include "format/global_manifest.h"
#include "format/manifest.h"
#include "format/names.h"
#include "io/small_file.h"
#include "read/delta_chain.h"
#include "read/rank_copy.h"
#include "util/hash.h"
#include "util/status_macros.h"

namespace ckpt::internal {
namespace {

// Tensors are read in batches of about this many bytes, so that a cancelled
// rebuild stops soon.
constexpr uint64_t kBatchBytes = uint64_t{256} << 20;

// The checksum of step `step`'s MANIFEST.json in multi-rank `dir`, which
// must list `part` (rank `rank`'s manifest, as read) as that rank's part.
absl::StatusOr<uint64_t> StepManifestHash(FileSystem& fs, const std::string& dir, int rank,
                                          const Manifest& part) {
  const std::string path = JoinPath(dir, kManifestName);
  CKPT_ASSIGN_OR_RETURN(std::string contents, ReadSmallFile(fs, path, kMaxManifestBytes));
  CKPT_ASSIGN_OR_RETURN(GlobalManifest global, ParseGlobalManifest(contents, path));
  if (global.step != part.step || rank >= static_cast<int>(global.ranks.size()) ||
      global.ranks[rank].manifest_xxh3 != part.manifest_xxh3) {
    return absl::DataLossError(absl::StrCat(path, " no longer lists the part of rank ", rank,
                                            " that was read (the checkpoint changed meanwhile)"));
  }
  return global.manifest_xxh3;
}

}  // namespace

std::string RebuiltFromText(const RebuiltFrom& from) {
  return absl::StrCat("base step ", from.base_step, " (", kManifestName, " ", HashToHex(from.base_step_xxh3),
                      "), newest step ", from.newest_step);
}

absl::StatusOr<std::optional<RebuiltFrom>> RebuildReference(
    std::shared_ptr<FileSystem> fs, const std::string& root, const IoOptions& io, bool differential,
    int rank, int world_size, ReferenceState* reference, const std::function<bool()>& cancelled,
    bool own_part_only) {
  reference->Invalidate();
  // A rank reads its own part (ReaderOptions::rank); its chain runs through
  // the same rank's parts of the base steps.
  const std::optional<int> part = world_size > 1 ? std::optional<int>(rank) : std::nullopt;
  ReaderOptions options;
  options.fs = fs;
  options.io = io;
  options.rank = part;
  own_part_only = own_part_only && part.has_value();
  auto open = [&]() { return own_part_only ? OpenOwnPart(root, options) : Reader::Open(root, options); };
  absl::StatusOr<std::unique_ptr<Reader>> newest = open();
  if (absl::IsNotFound(newest.status())) return std::optional<RebuiltFrom>();
  CKPT_RETURN_IF_ERROR(newest.status());
  // Another world's parts hold other slices of the state: no base for this one.
  if ((*newest)->world_size() != world_size) return std::optional<RebuiltFrom>();
  CKPT_ASSIGN_OR_RETURN(DeltaChain chain, DeltaChain::Load(*fs, root, (*newest)->step(), part));
  const ChainLink& base = differential ? chain.link(0) : chain.opened();
  std::unique_ptr<Reader> reader = std::move(*newest);
  if (base.manifest.step != reader->step()) {
    options.step = base.manifest.step;
    CKPT_ASSIGN_OR_RETURN(reader, open());
  }
  // The tensors of the base's own manifest (a rank's part: those it saved,
  // not the replicated ones other ranks wrote); a chunk of a sharded tensor
  // is read as the region of the global tensor it covers (from a rank's own
  // part alone, as the record it is).
  std::vector<ReadTarget> whole;
  std::vector<RegionTarget> regions;
  uint64_t batch_bytes = 0;
  auto flush = [&]() -> absl::Status {
    if (cancelled()) return absl::CancelledError("engine closing");
    if (!whole.empty()) CKPT_RETURN_IF_ERROR(reader->ReadInto(whole));
    if (!regions.empty()) CKPT_RETURN_IF_ERROR(reader->ReadRegions(regions));
    whole.clear();
    regions.clear();
    batch_bytes = 0;
    return absl::OkStatus();
  };
  for (const TensorInfo& t : base.manifest.tensors) {
    char* dst = reference->FindOrCreate(t.name, t.dtype, t.shape, t.raw_bytes);
    if (dst == nullptr) continue;  // over the budget: saved whole, as it would be anyway
    if (t.placement == TensorPlacement::kSharded && !own_part_only) {
      regions.push_back(RegionTarget{t.name, t.global_offset, t.shape, dst, t.raw_bytes});
    } else {
      whole.push_back(ReadTarget{t.name, dst, t.raw_bytes});
    }
    batch_bytes += t.raw_bytes;
    if (batch_bytes >= kBatchBytes) CKPT_RETURN_IF_ERROR(flush());
  }
  CKPT_RETURN_IF_ERROR(flush());
  RebuiltFrom from;
  from.newest_step = chain.opened().manifest.step;
  from.base_step = base.manifest.step;
  from.base_step_xxh3 = base.manifest.manifest_xxh3;
  if (part.has_value()) {
    CKPT_ASSIGN_OR_RETURN(from.base_step_xxh3, StepManifestHash(*fs, base.dir, rank, base.manifest));
  }
  // The counters, from this chain alone (a rank's own parts: what this
  // rank's saves left them at). Saves since the full one (`full_every`): the
  // chain's deltas, or, for differential deltas (each applies to the full
  // save alone), every checkpoint after the full one up to the newest.
  uint64_t chain_bytes = 0;
  for (size_t l = 0; l < chain.size(); ++l) chain_bytes += chain.link(l).manifest.shard_bytes();
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
  return std::optional<RebuiltFrom>(from);
}

}  // namespace ckpt::internal
