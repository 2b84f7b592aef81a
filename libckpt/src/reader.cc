// `Reader`: the public face of reading a checkpoint. Loading the step's view
// and delta chains, opening shards, and reading, decoding and verifying
// records live in read/; this file checks arguments and puts those pieces in
// order.
#include "ckpt/reader.h"
#include "ckpt/object_store.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "ckpt/catalog.h"
#include "distributed/rank_layout.h"
#include "io/backend.h"
#include "read/apply_chains.h"
#include "read/decode_record.h"
#include "format/global_tensors.h"
#include "read/delta_chain.h"
#include "read/fault_ahead.h"
#include "read/load_manifest.h"
#include "read/rank_copy.h"
#include "read/read_chunks.h"
#include "read/read_raw_records.h"
#include "read/read_regions.h"
#include "read/shard_files.h"
#include "read/step_view.h"
#include "read/verify_full.h"
#include "util/log.h"
#include "util/status_macros.h"
#include "util/worker_pool.h"

namespace ckpt {
namespace {

using namespace internal;  // NOLINT: the reader is glue over the internals

uint64_t LargestRawBytes(const std::vector<TensorInfo>& tensors) {
  uint64_t largest = 0;
  for (const TensorInfo& t : tensors) largest = std::max(largest, t.raw_bytes);
  return largest;
}

// OK if tensors `a` and `b`, read into one storage, hold the same value (a
// tied weight saved under two names): the storage is then filled once.
absl::Status CheckSameValue(const TensorInfo& a, const TensorInfo& b) {
  const bool whole = a.chunks.empty() && b.chunks.empty();  // (a global tensor has no one xxh3)
  if (a.name == b.name ||
      (whole && a.dtype == b.dtype && a.raw_bytes == b.raw_bytes && a.xxh3 == b.xxh3)) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("tensors \"", a.name, "\" and \"", b.name,
                                                 "\" are read into the same memory but hold "
                                                 "different values"));
}

class ReaderImpl final : public Reader {
 public:
  ReaderImpl(std::shared_ptr<FileSystem> fs, const IoOptions& io, StepView view,
             internal::OpenedIo backend)
      : view_(std::move(view)),
        files_(std::move(fs), io, std::move(backend)),
        chunks_(io, LargestPartRecord(view_), files_.queue()),
        chains_(io) {
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
  absl::StatusOr<std::vector<Tensor>> ReadNamed(std::span<const std::string> names) override;
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
  // its raw bytes), verifying each: its newest whole record, then the links
  // of its delta chain after that, all of them together (`ChainApplier`).
  absl::Status ReadRecords(std::span<const RecordRef> records, std::span<char* const> dsts);
  // Reads `infos` into new memory (ReadAll, ReadNamed).
  absl::StatusOr<std::vector<Tensor>> ReadNew(std::span<const TensorInfo* const> infos);
  // Reads whole records (compressed ones one at a time, raw ones together).
  absl::Status ReadWholeRecords(std::span<const RecordTarget> records);
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
  ChainApplier chains_;  // its arena is kept from call to call
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
  // Records with no delta after them are read here; the bases of the others
  // by the chain pipeline, just before their links, so that reading bases
  // overlaps applying links.
  std::vector<RecordTarget> whole;
  std::vector<ChainTarget> chains;
  std::vector<size_t> record_of;  // by chain target
  for (size_t i = 0; i < records.size(); ++i) {
    if (bases[i] + 1 < names[i].chain->size()) {
      chains.push_back(ChainTarget{names[i].chain, names[i].name, bases[i], records[i].dst});
      record_of.push_back(i);
    } else {
      whole.push_back(records[i]);
    }
  }
  CKPT_RETURN_IF_ERROR(ReadWholeRecords(whole));
  return chains_.Apply(files_, chains, [&](std::span<const size_t> targets) {
    std::vector<RecordTarget> some;
    some.reserve(targets.size());
    for (size_t c : targets) some.push_back(records[record_of[c]]);
    return ReadWholeRecords(some);
  });
}

absl::Status ReaderImpl::ReadWholeRecords(std::span<const RecordTarget> records) {
  // Compressed records first, read one at a time and decoded while the next
  // is read (one executor per queue at a time); then the raw ones together.
  std::vector<RecordTarget> compressed;
  for (const RecordTarget& record : records) {
    if (IsCompressedEncoding(record.info->encoding)) compressed.push_back(record);
  }
  CKPT_RETURN_IF_ERROR(DecodeCompressedRecords(files_, compressed));
  return ReadRawRecords(files_, chunks_, records);
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
  // One storage is filled once (as by `ReadInto`): data -> the first target into it.
  absl::flat_hash_map<const void*, const RegionTarget*> filled;
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
    if (bytes > 0) {
      auto [it, first] = filled.try_emplace(target.data, &target);
      if (!first) {
        const RegionTarget& earlier = *it->second;
        if (earlier.offset != target.offset || earlier.shape != target.shape) {
          return absl::InvalidArgumentError(absl::StrCat(where, " and the region of tensor \"", earlier.name,
                                                         "\" are read into the same memory but are different boxes"));
        }
        CKPT_RETURN_IF_ERROR(CheckSameValue(view_.tensors[index_.at(earlier.name)], info));
        continue;
      }
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
  // One storage is filled once, however many names it is read under.
  absl::flat_hash_map<const void*, size_t> filled;  // data -> index in the view
  for (const ReadTarget& target : targets) {
    CKPT_ASSIGN_OR_RETURN(const size_t index, IndexOf(target.name));
    const TensorInfo& info = view_.tensors[index];
    if (target.capacity < info.raw_bytes || (info.raw_bytes > 0 && target.data == nullptr)) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", target.name, "\" needs ",
                                                     info.raw_bytes, " bytes, target has ",
                                                     target.capacity));
    }
    if (info.raw_bytes > 0) {
      auto [it, first] = filled.try_emplace(target.data, index);
      if (!first) {
        CKPT_RETURN_IF_ERROR(CheckSameValue(view_.tensors[it->second], info));
        continue;
      }
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
  std::vector<const TensorInfo*> infos;
  infos.reserve(view_.tensors.size());
  for (const TensorInfo& info : view_.tensors) infos.push_back(&info);
  return ReadNew(infos);
}

absl::StatusOr<std::vector<Tensor>> ReaderImpl::ReadNamed(std::span<const std::string> names) {
  std::vector<const TensorInfo*> infos;
  infos.reserve(names.size());
  for (const std::string& name : names) {
    CKPT_ASSIGN_OR_RETURN(const size_t i, IndexOf(name));
    infos.push_back(&view_.tensors[i]);
  }
  return ReadNew(infos);
}

absl::StatusOr<std::vector<Tensor>> ReaderImpl::ReadNew(std::span<const TensorInfo* const> infos) {
  std::vector<Tensor> tensors;
  std::vector<ReadTarget> targets;
  tensors.reserve(infos.size());
  for (const TensorInfo* info : infos) {
    Tensor tensor{info->name, info->dtype, info->shape, {}};
    CKPT_ASSIGN_OR_RETURN(tensor.bytes, AlignedBytes::Allocate(info->raw_bytes, false));
    targets.push_back(ReadTarget{info->name, tensor.bytes.data(), tensor.bytes.size()});
    tensors.push_back(std::move(tensor));
  }
  // The memory is new: other cores fault it in ahead of the reads, so the
  // thread submitting them does not pay first touch.
  std::vector<FaultAhead::Range> fresh;
  fresh.reserve(targets.size());
  for (const ReadTarget& t : targets) fresh.push_back({static_cast<char*>(t.data), t.capacity});
  FaultAhead faulting(fresh, std::min(WorkerPool::DefaultThreads(0), 4));
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
    // Tensors in groups of up to twice the I/O buffer (or one larger), so
    // that the chains of many are applied at once, through one buffer.
    uint64_t total = 0;
    for (const TensorInfo& t : manifest.tensors) total += AlignUp(t.raw_bytes);
    const uint64_t room = std::max<uint64_t>(AlignUp(LargestRawBytes(manifest.tensors)),
                                             std::min<uint64_t>(total, 2 * files_.io().buffer_bytes));
    CKPT_ASSIGN_OR_RETURN(AlignedBytes buffer, AlignedBytes::Allocate(room, false));
    std::vector<RecordRef> group;
    std::vector<char*> dsts;
    uint64_t used = 0;
    auto verify_group = [&]() -> absl::Status {
      CKPT_RETURN_IF_ERROR(ReadRecords(group, dsts));
      for (const RecordRef& r : group) {
        if (progress) progress(chain.Find(chain.size() - 1, *r.name)->raw_bytes);
      }
      group.clear();
      dsts.clear();
      used = 0;
      return absl::OkStatus();
    };
    for (const TensorInfo& t : manifest.tensors) {
      if (!group.empty() && used + AlignUp(t.raw_bytes) > room) CKPT_RETURN_IF_ERROR(verify_group());
      group.push_back(RecordRef{&chain, &t.name});
      dsts.push_back(static_cast<char*>(buffer.data()) + used);
      used += AlignUp(t.raw_bytes);
    }
    if (!group.empty()) CKPT_RETURN_IF_ERROR(verify_group());
  }
  return absl::OkStatus();
}

// Where `root` holds the ranks' own directories of a multi-rank checkpoint
// saved with `DistributedOptions::shared_root = false`, what to read
// instead; else "".
std::string RankCopiesHint(FileSystem& fs, const std::string& root) {
  auto names = fs.ListDir(root);
  if (!names.ok()) return "";
  for (const std::string& name : *names) {
    absl::string_view rest = name;
    int rank = 0;
    if (absl::ConsumePrefix(&rest, "rank-") && rest.size() == 5 && absl::SimpleAtoi(rest, &rank)) {
      return absl::StrCat(
          " (it holds ranks' own directories, such as ", name,
          ", of a checkpoint saved by ranks that share no file system: each holds only its rank's part, "
          "and the checkpoint is whole only in the bucket they uploaded it to; read it from there)");
    }
  }
  return "";
}

// `failed` (why no step of `root` could be read), or, where `root` is one
// rank's own copy of a multi-rank checkpoint (`RankCopyOf`), what it is.
absl::Status ExplainRankCopy(const std::shared_ptr<FileSystem>& fs, const std::string& root,
                             const absl::Status& failed) {
  auto rank = RankCopyOf(root, fs);
  if (!rank.ok() || !rank->has_value()) return failed;
  return absl::FailedPreconditionError(
      absl::StrCat(DescribeRankCopy(root, **rank), "; read it from there (here: ", failed.message(), ")"));
}

// `Reader::Open`, or with `own_part_only` `internal::OpenOwnPart`.
absl::StatusOr<std::unique_ptr<Reader>> OpenReader(const std::string& root, const ReaderOptions& options,
                                                   bool own_part_only) {
  // An s3:// root reads through the object store's read-only file system.
  CKPT_ASSIGN_OR_RETURN(std::shared_ptr<FileSystem> fs, FileSystemForRoot(root, options.fs));
  CKPT_ASSIGN_OR_RETURN(std::vector<int64_t> steps, ListSteps(root, fs));
  // A bucket: each transfer is a ranged GET, whose cost is mostly per
  // request; larger transfers (AWS's byte-range guidance is 8-16 MB) unless
  // the caller chose a size.
  IoOptions io = options.io;
  if (fs->name() == "s3" && io.chunk_bytes == IoOptions{}.chunk_bytes) io.chunk_bytes = size_t{8} << 20;
  auto opened = OpenIo(*fs, io, "");
  if (!opened.ok()) return Annotate(opened.status(), absl::StrCat("checkpoint root ", root));
  internal::OpenedIo backend = std::move(*opened);
  if (options.step.has_value()) {
    const int64_t step = *options.step;
    if (!std::binary_search(steps.begin(), steps.end(), step)) {
      return absl::NotFoundError(absl::StrCat("no checkpoint for step ", step, " in ", root));
    }
    auto view = LoadStepView(*fs, root, step, options.rank, own_part_only);
    if (!view.ok()) return own_part_only ? view.status() : ExplainRankCopy(fs, root, view.status());
    return std::unique_ptr<Reader>(new ReaderImpl(fs, io, std::move(*view), std::move(backend)));
  }
  std::string skipped;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    auto view = LoadStepView(*fs, root, *it, options.rank, own_part_only);
    if (view.ok()) {
      return std::unique_ptr<Reader>(new ReaderImpl(fs, io, std::move(*view), std::move(backend)));
    }
    // Only damage is skipped: an I/O error (EIO, EACCES, ...) may be
    // transient, and silently restoring an older step would hide it.
    absl::Status failed = Annotate(view.status(), absl::StrCat("checkpoint step ", *it, " in ", root));
    if (view.status().code() != absl::StatusCode::kDataLoss &&
        view.status().code() != absl::StatusCode::kUnimplemented) {
      return own_part_only ? failed : ExplainRankCopy(fs, root, failed);
    }
    if (skipped.empty() && !own_part_only) {
      // A rank's own copy: every step would fail alike; say what it is now.
      absl::Status explained = ExplainRankCopy(fs, root, failed);
      if (explained.code() != failed.code()) return explained;
    }
    Log(LogLevel::kWarning, absl::StrCat("skipping step ", *it, ": ", view.status().message()));
    absl::StrAppend(&skipped, skipped.empty() ? "" : "; ", "step ", *it, ": ",
                    view.status().message());
  }
  if (skipped.empty()) return absl::NotFoundError(absl::StrCat("no checkpoint in ", root, RankCopiesHint(*fs, root)));
  return absl::DataLossError(absl::StrCat("no readable checkpoint in ", root, " (", skipped, ")"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Reader>> Reader::Open(const std::string& root,
                                                     const ReaderOptions& options) {
  return OpenReader(root, options, /*own_part_only=*/false);
}

namespace internal {

absl::StatusOr<std::unique_ptr<Reader>> OpenOwnPart(const std::string& root, const ReaderOptions& options) {
  if (!options.rank.has_value()) return absl::InvalidArgumentError("OpenOwnPart needs a rank");
  return OpenReader(root, options, /*own_part_only=*/true);
}

}  // namespace internal

}  // namespace ckpt
