// `Reader`: the public face of reading a checkpoint. Loading the delta chain,
// opening shards, and reading, decoding and verifying records live in read/;
// this file checks arguments and puts those pieces in order.
#include "ckpt/reader.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "ckpt/catalog.h"
#include "distributed/rank_layout.h"
#include "io/backend.h"
#include "read/apply_chain.h"
#include "read/decode_record.h"
#include "format/global_tensors.h"
#include "read/delta_chain.h"
#include "read/load_manifest.h"
#include "read/read_chunks.h"
#include "read/read_raw_records.h"
#include "read/read_regions.h"
#include "read/shard_files.h"
#include "read/verify_full.h"
#include "util/log.h"
#include "util/status_macros.h"

namespace ckpt {
namespace {

using namespace internal;  // NOLINT: the reader is glue over the internals

uint64_t LargestRawBytes(const std::vector<TensorInfo>& tensors) {
  uint64_t largest = 0;
  for (const TensorInfo& t : tensors) largest = std::max(largest, t.raw_bytes);
  return largest;
}

// One delta chain a reader draws tensors from: a single-process
// checkpoint's, or one rank's part of a multi-rank one.
struct ReaderPart {
  int rank = 0;
  DeltaChain chain;
};

// Where a tensor the reader shows comes from: one part's record, or (a
// sharded tensor) the chunks of `StepView::globals[global]`.
struct TensorSource {
  size_t part = 0;
  std::string name;  // its name in that part
  size_t global = SIZE_MAX;
};

// What a reader shows of one step: the parts it reads and its tensors.
struct StepView {
  int64_t step = 0;
  std::string dir;
  std::string extras_json;
  int world_size = 1;
  int rank = 0;  // -1: every rank's part
  std::vector<ReaderPart> parts;
  std::vector<TensorInfo> tensors;
  std::vector<TensorSource> sources;  // parallel to `tensors`
  std::vector<GlobalTensor> globals;   // pieces index `parts`
};

// The view of step `step` of `root` for `rank` (see ReaderOptions::rank).
absl::StatusOr<StepView> LoadStepView(FileSystem& fs, const std::string& root, int64_t step,
                                      std::optional<int> rank) {
  const std::string dir = JoinPath(root, CheckpointDirName(step));
  CKPT_ASSIGN_OR_RETURN(StepManifest manifest, LoadStepManifest(fs, dir, step));
  StepView view;
  view.step = step;
  view.dir = dir;
  if (!manifest.multi_rank) {
    if (rank.has_value() && *rank != 0) {
      return absl::NotFoundError(absl::StrCat("checkpoint ", dir, " was written by one process: it has no rank ",
                                              *rank, " (only rank 0)"));
    }
    CKPT_ASSIGN_OR_RETURN(DeltaChain chain,
                          DeltaChain::Load(fs, root, step, std::nullopt, std::move(manifest.single)));
    view.extras_json = chain.opened().manifest.extras_json;
    view.tensors = chain.opened().manifest.tensors;
    for (const TensorInfo& t : view.tensors) view.sources.push_back(TensorSource{0, t.name});
    view.parts.push_back(ReaderPart{0, std::move(chain)});
    return view;
  }
  const GlobalManifest& global = manifest.global;
  view.world_size = global.world_size;
  view.rank = rank.value_or(-1);
  if (rank.has_value() && (*rank < 0 || *rank >= global.world_size)) {
    return absl::NotFoundError(absl::StrCat("checkpoint ", dir, " has ranks 0..", global.world_size - 1,
                                            ", not rank ", *rank));
  }
  // The parts the view draws from: the rank's own first (its tensors come
  // first, in its order), then those holding replicated tensors or chunks of
  // sharded ones, by rank (every part, for the whole checkpoint).
  std::vector<int> ranks;
  if (rank.has_value()) ranks.push_back(*rank);
  for (int r = 0; r < global.world_size; ++r) {
    bool shared = false;
    for (const TensorInfo& t : manifest.parts[r].tensors) {
      shared |= t.placement == TensorPlacement::kReplicated || t.placement == TensorPlacement::kSharded;
    }
    if (!rank.has_value() || (r != *rank && shared)) ranks.push_back(r);
  }
  view.parts.reserve(ranks.size());
  absl::flat_hash_set<std::string> names;
  for (int r : ranks) {
    CKPT_ASSIGN_OR_RETURN(DeltaChain chain,
                          DeltaChain::Load(fs, root, step, r, std::move(manifest.parts[r])));
    const size_t part = view.parts.size();
    const bool own = rank.has_value() && r == *rank;
    for (const TensorInfo& t : chain.opened().manifest.tensors) {
      if (t.placement == TensorPlacement::kSharded) continue;  // shown whole, below
      const bool replicated = t.placement == TensorPlacement::kReplicated;
      if (rank.has_value() && !own && !replicated) continue;
      TensorInfo shown = t;
      shown.rank = r;
      if (!rank.has_value() && !replicated) shown.name = absl::StrCat("rank", r, "/", t.name);
      if (!names.insert(shown.name).second) {
        return absl::DataLossError(absl::StrCat("checkpoint ", dir, " holds tensor \"", shown.name,
                                                "\" twice (rank ", r, ")"));
      }
      view.sources.push_back(TensorSource{part, t.name});
      view.tensors.push_back(std::move(shown));
    }
    if (own) view.extras_json = chain.opened().manifest.extras_json;
    view.parts.push_back(ReaderPart{r, std::move(chain)});
  }
  if (!rank.has_value()) view.extras_json = global.extras_json;
  // Each sharded tensor once, whole, from its chunks on every rank.
  std::vector<RankRecords> records;
  for (const ReaderPart& p : view.parts) records.push_back(RankRecords{p.rank, &p.chain.opened().manifest.tensors});
  absl::StatusOr<std::vector<GlobalTensor>> globals = GatherGlobalTensors(records);
  if (!globals.ok()) {
    return absl::DataLossError(absl::StrCat("checkpoint ", dir, ": ", globals.status().message()));
  }
  view.globals = std::move(*globals);
  for (size_t g = 0; g < view.globals.size(); ++g) {
    TensorInfo shown = GlobalTensorInfo(view.globals[g], records);
    if (!names.insert(shown.name).second) {
      return absl::DataLossError(absl::StrCat("checkpoint ", dir, " holds tensor \"", shown.name,
                                              "\" both sharded and whole"));
    }
    view.sources.push_back(TensorSource{0, shown.name, g});
    view.tensors.push_back(std::move(shown));
  }
  return view;
}

class ReaderImpl final : public Reader {
 public:
  ReaderImpl(std::shared_ptr<FileSystem> fs, const IoOptions& io, StepView view,
             internal::OpenedIo backend)
      : view_(std::move(view)),
        files_(std::move(fs), io, std::move(backend)),
        chunks_(io, LargestPartRecord(view_), files_.queue()) {
    for (size_t i = 0; i < view_.tensors.size(); ++i) index_[view_.tensors[i].name] = i;
  }

  int64_t step() const override { return view_.step; }
  const std::string& dir() const override { return view_.dir; }
  int world_size() const override { return view_.world_size; }
  int rank() const override { return view_.rank; }
  const std::string& extras_json() const override { return view_.extras_json; }
  const std::vector<TensorInfo>& tensors() const override { return view_.tensors; }
  const TensorInfo* Find(absl::string_view name) const override {
    auto it = index_.find(name);
    return it == index_.end() ? nullptr : &view_.tensors[it->second];
  }

  absl::Status ReadInto(std::span<const ReadTarget> targets) override;
  absl::Status ReadRegions(std::span<const RegionTarget> targets) override;
  uint64_t bytes_read() const override { return files_.bytes_read(); }
  absl::StatusOr<Tensor> Read(absl::string_view name) override;
  absl::StatusOr<std::vector<Tensor>> ReadAll() override;
  using Reader::Verify;
  absl::Status Verify(const VerifyProgress& progress) override;

 private:
  static uint64_t LargestPartRecord(const StepView& view) {
    uint64_t largest = 0;
    for (const ReaderPart& p : view.parts) {
      largest = std::max(largest, LargestRawBytes(p.chain.opened().manifest.tensors));
    }
    return largest;
  }
  // Reads each of `records` whole into the matching `dsts` entry (room for
  // its raw bytes), verifying each.
  absl::Status ReadRecords(std::span<const RecordRef> records, std::span<char* const> dsts);
  // The position of tensor `name` in the view; kNotFound naming it.
  absl::StatusOr<size_t> IndexOf(absl::string_view name) const {
    auto it = index_.find(name);
    if (it == index_.end()) return absl::NotFoundError(absl::StrCat("no tensor \"", name, "\" in ", dir()));
    return it->second;
  }
  // Reads `reads` from their pieces, whole records through `ReadRecords`.
  absl::Status ReadPieces(std::span<const RegionRead> reads) {
    return ReadRegionPieces(files_, chunks_, reads,
                            [this](std::span<const RecordRef> records, std::span<char* const> dsts) {
                              return ReadRecords(records, dsts);
                            });
  }
  // The region read of `region` of tensor `index` of the view into `dst`.
  RegionRead RegionOf(size_t index, Box region, char* dst) const;

  const StepView view_;
  absl::flat_hash_map<std::string, size_t> index_;  // name -> position in view_.tensors
  ShardFiles files_;
  ReadChunks chunks_;  // created on first use; uses `files_`'s queue
};

absl::Status ReaderImpl::ReadRecords(std::span<const RecordRef> names, std::span<char* const> dsts) {
  // Each target starts from the newest whole record of its chain.
  std::vector<RecordTarget> records;
  std::vector<size_t> bases;  // the chain link of each record
  records.reserve(names.size());
  bases.reserve(names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    const DeltaChain& chain = *names[i].chain;
    const std::string& name = *names[i].name;
    CKPT_ASSIGN_OR_RETURN(size_t base, chain.BaseLinkOf(name));
    records.push_back(RecordTarget{&chain.link(base).dir, chain.Find(base, name), dsts[i]});
    bases.push_back(base);
  }
  // Compressed records first, each on its own (one executor per queue at a time).
  for (const RecordTarget& record : records) {
    if (IsCompressedEncoding(record.info->encoding)) {
      CKPT_RETURN_IF_ERROR(DecodeCompressedRecord(files_, *record.dir, *record.info, record.dst));
    }
  }
  CKPT_RETURN_IF_ERROR(ReadRawRecords(files_, chunks_, records));
  // Then the deltas of every record at once (read/apply_chain.h).
  std::vector<ChainTarget> chained;
  std::vector<size_t> of;  // the record of each chained target
  for (size_t i = 0; i < records.size(); ++i) {
    if (bases[i] + 1 < names[i].chain->size()) {
      chained.push_back(ChainTarget{names[i].chain, names[i].name, bases[i], records[i].dst});
      of.push_back(i);
    }
  }
  if (chained.empty()) return absl::OkStatus();
  return ApplyChains(files_, chained, [&](size_t c) -> absl::Status {
    const RecordTarget& record = records[of[c]];
    if (IsCompressedEncoding(record.info->encoding)) {
      return DecodeCompressedRecord(files_, *record.dir, *record.info, record.dst);
    }
    return ReadRawRecords(files_, chunks_, {&record, 1});
  });
}

RegionRead ReaderImpl::RegionOf(size_t index, Box region, char* dst) const {
  const TensorInfo& info = view_.tensors[index];
  const TensorSource& source = view_.sources[index];
  RegionRead read{info.dtype, std::move(region), dst, {}};
  if (source.global == SIZE_MAX) {
    read.pieces.push_back(RegionPiece{RecordRef{&view_.parts[source.part].chain, &source.name},
                                      Box{std::vector<int64_t>(info.shape.size(), 0), info.shape}});
    return read;
  }
  for (const GlobalTensor::Piece& p : view_.globals[source.global].pieces) {
    read.pieces.push_back(RegionPiece{RecordRef{&view_.parts[p.part].chain, &p.record->name},
                                      Box{p.record->global_offset, p.record->shape}});
  }
  return read;
}

absl::Status ReaderImpl::ReadRegions(std::span<const RegionTarget> targets) {
  std::vector<RegionRead> reads;
  reads.reserve(targets.size());
  for (const RegionTarget& target : targets) {
    CKPT_ASSIGN_OR_RETURN(const size_t index, IndexOf(target.name));
    const TensorInfo& info = view_.tensors[index];
    const std::string where = absl::StrCat("region of tensor \"", target.name, "\"");
    if (target.offset.size() != info.shape.size() || target.shape.size() != info.shape.size()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": the tensor has ", info.shape.size(),
                                                     " dimensions, the region's offset ", target.offset.size(),
                                                     " and shape ", target.shape.size()));
    }
    for (size_t d = 0; d < info.shape.size(); ++d) {
      if (target.offset[d] < 0 || target.shape[d] < 0 || target.offset[d] > info.shape[d] ||
          target.shape[d] > info.shape[d] - target.offset[d]) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": [", target.offset[d], ", +", target.shape[d],
                                                       ") of dimension ", d, " lies outside its ",
                                                       info.shape[d]));
      }
    }
    CKPT_ASSIGN_OR_RETURN(uint64_t bytes, TensorBytes(info.dtype, target.shape));
    if (target.capacity < bytes || (bytes > 0 && target.data == nullptr)) {
      return absl::InvalidArgumentError(absl::StrCat(where, " needs ", bytes, " bytes, target has ",
                                                     target.capacity));
    }
    reads.push_back(RegionOf(index, Box{target.offset, target.shape}, static_cast<char*>(target.data)));
  }
  return ReadPieces(reads);
}

absl::Status ReaderImpl::ReadInto(std::span<const ReadTarget> targets) {
  std::vector<RecordRef> names;
  std::vector<char*> dsts;
  std::vector<RegionRead> whole;  // sharded tensors, from their chunks
  names.reserve(targets.size());
  dsts.reserve(targets.size());
  for (const ReadTarget& target : targets) {
    CKPT_ASSIGN_OR_RETURN(const size_t index, IndexOf(target.name));
    const TensorInfo& info = view_.tensors[index];
    if (target.capacity < info.raw_bytes || (info.raw_bytes > 0 && target.data == nullptr)) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", target.name, "\" needs ",
                                                     info.raw_bytes, " bytes, target has ",
                                                     target.capacity));
    }
    const TensorSource& source = view_.sources[index];
    if (source.global != SIZE_MAX) {
      whole.push_back(RegionOf(index, Box{std::vector<int64_t>(info.shape.size(), 0), info.shape},
                               static_cast<char*>(target.data)));
      continue;
    }
    names.push_back(RecordRef{&view_.parts[source.part].chain, &source.name});
    dsts.push_back(static_cast<char*>(target.data));
  }
  CKPT_RETURN_IF_ERROR(ReadRecords(names, dsts));
  if (whole.empty()) return absl::OkStatus();
  return ReadPieces(whole);
}

absl::StatusOr<Tensor> ReaderImpl::Read(absl::string_view name) {
  const TensorInfo* info = Find(name);
  if (info == nullptr) return absl::NotFoundError(absl::StrCat("no tensor \"", name, "\" in ", dir()));
  Tensor tensor{info->name, info->dtype, info->shape, {}};
  CKPT_ASSIGN_OR_RETURN(tensor.bytes, AlignedBytes::Allocate(info->raw_bytes, false));
  ReadTarget target{info->name, tensor.bytes.data(), tensor.bytes.size()};
  CKPT_RETURN_IF_ERROR(ReadInto({&target, 1}));
  return tensor;
}

absl::StatusOr<std::vector<Tensor>> ReaderImpl::ReadAll() {
  std::vector<Tensor> tensors;
  std::vector<ReadTarget> targets;
  tensors.reserve(view_.tensors.size());
  for (const TensorInfo& info : view_.tensors) {
    Tensor tensor{info.name, info.dtype, info.shape, {}};
    CKPT_ASSIGN_OR_RETURN(tensor.bytes, AlignedBytes::Allocate(info.raw_bytes, false));
    targets.push_back(ReadTarget{info.name, tensor.bytes.data(), tensor.bytes.size()});
    tensors.push_back(std::move(tensor));
  }
  CKPT_RETURN_IF_ERROR(ReadInto(targets));
  return tensors;
}

absl::Status ReaderImpl::Verify(const VerifyProgress& progress) {
  // Every part the view draws from, whole: a full one by reading its shards
  // straight through, a delta by rebuilding each tensor through its chain.
  for (size_t p = 0; p < view_.parts.size(); ++p) {
    const DeltaChain& chain = view_.parts[p].chain;
    const Manifest& manifest = chain.opened().manifest;
    if (!chain.is_delta()) {
      CKPT_RETURN_IF_ERROR(VerifyFullCheckpoint(files_, chunks_, chain.opened().dir, manifest, progress));
      continue;
    }
    CKPT_ASSIGN_OR_RETURN(AlignedBytes buffer,
                          AlignedBytes::Allocate(LargestRawBytes(manifest.tensors), false));
    for (const TensorInfo& t : manifest.tensors) {
      const RecordRef record{&chain, &t.name};
      char* dst = static_cast<char*>(buffer.data());
      CKPT_RETURN_IF_ERROR(ReadRecords({&record, 1}, {&dst, 1}));
      if (progress) progress(t.raw_bytes);
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Reader>> Reader::Open(const std::string& root,
                                                     const ReaderOptions& options) {
  std::shared_ptr<FileSystem> fs = options.fs != nullptr ? options.fs : PosixFileSystem();
  CKPT_ASSIGN_OR_RETURN(std::vector<int64_t> steps, ListSteps(root, fs));
  auto opened = OpenIo(*fs, options.io, "");
  if (!opened.ok()) return Annotate(opened.status(), absl::StrCat("checkpoint root ", root));
  internal::OpenedIo backend = std::move(*opened);
  if (options.step.has_value()) {
    const int64_t step = *options.step;
    if (!std::binary_search(steps.begin(), steps.end(), step)) {
      return absl::NotFoundError(absl::StrCat("no checkpoint for step ", step, " in ", root));
    }
    CKPT_ASSIGN_OR_RETURN(StepView view, LoadStepView(*fs, root, step, options.rank));
    return std::unique_ptr<Reader>(new ReaderImpl(fs, options.io, std::move(view), std::move(backend)));
  }
  std::string skipped;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    auto view = LoadStepView(*fs, root, *it, options.rank);
    if (view.ok()) {
      return std::unique_ptr<Reader>(new ReaderImpl(fs, options.io, std::move(*view), std::move(backend)));
    }
    // Only damage is skipped: an I/O error (EIO, EACCES, ...) may be
    // transient, and silently restoring an older step would hide it.
    if (view.status().code() != absl::StatusCode::kDataLoss &&
        view.status().code() != absl::StatusCode::kUnimplemented) {
      return Annotate(view.status(), absl::StrCat("checkpoint step ", *it, " in ", root));
    }
    Log(LogLevel::kWarning, absl::StrCat("skipping step ", *it, ": ", view.status().message()));
    absl::StrAppend(&skipped, skipped.empty() ? "" : "; ", "step ", *it, ": ",
                    view.status().message());
  }
  if (skipped.empty()) return absl::NotFoundError(absl::StrCat("no checkpoint in ", root));
  return absl::DataLossError(absl::StrCat("no readable checkpoint in ", root, " (", skipped, ")"));
}

}  // namespace ckpt
