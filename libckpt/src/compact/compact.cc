// `CompactToFull`: a delta checkpoint rewritten as a full one. See ckpt/compact.h.
#include "ckpt/compact.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "ckpt/reader.h"
#include "ckpt/root_lock.h"
#include "compact/swap.h"
#include "format/manifest.h"
#include "format/names.h"
#include "format/shard_plan.h"
#include "io/backend.h"
#include "io/io_executor.h"
#include "io/small_file.h"
#include "read/load_manifest.h"
#include "util/log.h"
#include "util/status_macros.h"
#include "ckpt/file_system.h"

namespace ckpt {
namespace {

using namespace internal;  // NOLINT: glue over the internals, like the reader

int64_t NowUnixNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// True if the reader opened the checkpoint `manifest` describes: same
// tensors, in the same order, with the same checksums.
bool SameTensors(const std::vector<TensorInfo>& a, const std::vector<TensorInfo>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].name != b[i].name || a[i].xxh3 != b[i].xxh3 || a[i].raw_bytes != b[i].raw_bytes) {
      return false;
    }
  }
  return true;
}

// The manifest of the full checkpoint that replaces `delta`, laid out as
// `plan` says: raw records, the delta's restored checksums and error bounds.
Manifest FullManifest(const Manifest& delta, const std::vector<PlannedShard>& plan) {
  Manifest full;
  full.step = delta.step;
  full.kind = CheckpointKind::kFull;
  full.compacted = true;
  full.compacted_from_manifest_xxh3 = delta.manifest_xxh3;
  full.compacted_from_base_step = delta.base_step;
  full.compacted_from_delta_mode = delta.delta_mode;
  full.compacted_unix_ns = NowUnixNs();
  full.created_unix_ns = delta.created_unix_ns;
  full.writer = delta.writer;
  full.extras_json = delta.extras_json;
  full.tensors = delta.tensors;  // names, shapes, restored checksums, error bounds
  for (const PlannedShard& shard : plan) PlaceRawRecords(shard, shard.file_bytes, &full);
  return full;
}

// Reads every tensor through `reader` (verified) and writes the shard files
// of `plan` into `dir`: records at their aligned offsets, zero gaps, each
// file truncated to its size, fsynced and closed.
absl::Status WriteShards(FileSystem& fs, internal::OpenedIo& backend, size_t chunk_bytes, Reader& reader,
                         const std::vector<PlannedShard>& plan,
                         const std::vector<TensorInfo>& tensors, const std::string& dir) {
  uint64_t largest = kRecordAlignment;
  for (const TensorInfo& t : tensors) largest = std::max(largest, AlignUp(t.raw_bytes, kRecordAlignment));
  CKPT_ASSIGN_OR_RETURN(AlignedBytes buffer, AlignedBytes::Allocate(largest, /*prefault=*/false));
  char* data = static_cast<char*>(buffer.data());
  OpenOptions open;
  open.write = open.create = open.exclusive = true;
  open.direct = backend.direct;
  for (const PlannedShard& shard : plan) {
    CKPT_ASSIGN_OR_RETURN(std::unique_ptr<File> file, fs.Open(JoinPath(dir, shard.file), open));
    for (const PlannedRecord& r : shard.records) {
      const TensorInfo& t = tensors[r.tensor];
      if (t.raw_bytes == 0) continue;
      ReadTarget target{t.name, data, buffer.size()};
      CKPT_RETURN_IF_ERROR(reader.ReadInto({&target, 1}));
      const uint64_t length = AlignUp(t.raw_bytes, kRecordAlignment);
      std::memset(data + t.raw_bytes, 0, length - t.raw_bytes);
      IoExecutor io(backend.queue.get(), chunk_bytes);
      CKPT_RETURN_IF_ERROR(io.Start(IoOp::Kind::kWrite, file.get(), r.offset, data, length, 0));
      CKPT_RETURN_IF_ERROR(io.Drain());
    }
    if (shard.padded_bytes != shard.file_bytes) CKPT_RETURN_IF_ERROR(file->Truncate(shard.file_bytes));
    CKPT_RETURN_IF_ERROR(file->Sync());
    CKPT_RETURN_IF_ERROR(file->Close());
  }
  return absl::OkStatus();
}

// Writes the full checkpoint of `delta` into the (new, empty) `temp`.
absl::Status WriteTemp(FileSystem& fs, const CompactOptions& options, Reader& reader,
                       const Manifest& delta, const std::string& temp, CompactStats* stats) {
  std::vector<TensorView> views;
  views.reserve(delta.tensors.size());
  for (const TensorInfo& t : delta.tensors) {
    TensorView view;
    view.name = t.name;
    view.dtype = t.dtype;
    view.shape = t.shape;
    view.nbytes = static_cast<size_t>(t.raw_bytes);
    views.push_back(std::move(view));
  }
  const std::vector<PlannedShard> plan =
      PlanShards(views, options.shard_min_bytes, options.shard_max_bytes);
  Manifest full = FullManifest(delta, plan);
  CKPT_ASSIGN_OR_RETURN(internal::OpenedIo backend, OpenIo(fs, options.io, temp));
  CKPT_RETURN_IF_ERROR(
      WriteShards(fs, backend, options.io.chunk_bytes, reader, plan, delta.tensors, temp));
  CKPT_ASSIGN_OR_RETURN(std::string contents, SerializeManifest(&full));
  CKPT_RETURN_IF_ERROR(WriteFileDurably(fs, JoinPath(temp, kManifestName), contents));
  // (Its directory is fsynced as it is published or swapped in.)
  stats->tensor_bytes = full.tensor_bytes();
  stats->file_bytes = full.shard_bytes();
  stats->tensor_count = full.tensors.size();
  stats->shard_count = full.shards.size();
  return absl::OkStatus();
}

absl::StatusOr<CompactStats> Compact(FileSystem& fs, std::shared_ptr<FileSystem> shared,
                                     const std::string& root, int64_t step,
                                     const CompactOptions& options) {
  const absl::Time start = absl::Now();
  const std::string name = CheckpointDirName(step);
  const std::string dir = JoinPath(root, name);
  const bool in_place = options.target_root.empty();
  const std::string target = in_place ? root : options.target_root;
  if (options.shard_max_bytes == 0) return absl::InvalidArgumentError("shard_max_bytes must be positive");
  if (auto stat = fs.Stat(dir); !stat.ok()) {
    if (absl::IsNotFound(stat.status())) return absl::NotFoundError(absl::StrCat("no checkpoint for step ", step));
    return stat.status();
  }
  auto loaded = LoadManifest(fs, dir, step);
  if (absl::IsUnimplemented(loaded.status()) &&
      absl::StrContains(loaded.status().message(), "multi-rank")) {
    return absl::FailedPreconditionError(absl::StrCat(
        "step ", step, " is a multi-rank checkpoint: compacting those is not supported (",
        loaded.status().message(), ")"));
  }
  CKPT_ASSIGN_OR_RETURN(Manifest delta, std::move(loaded));
  if (delta.kind != CheckpointKind::kDelta) {
    return absl::FailedPreconditionError(absl::StrCat("step ", step, " is already a full checkpoint"));
  }
  if (!in_place && fs.Stat(JoinPath(target, name)).ok()) {
    return absl::AlreadyExistsError(absl::StrCat(JoinPath(target, name), " already exists"));
  }
  ReaderOptions read;
  read.fs = std::move(shared);
  read.io = options.io;
  read.step = step;
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<Reader> reader, Reader::Open(root, read));
  if (!SameTensors(reader->tensors(), delta.tensors)) {
    return absl::AbortedError(absl::StrCat(dir, " changed while it was being compacted"));
  }

  CompactStats stats;
  stats.step = step;
  const std::string temp =
      JoinPath(target, UniqueName(kCompactTempPrefix, name));
  CKPT_RETURN_IF_ERROR(fs.CreateDir(temp));
  absl::Status s = WriteTemp(fs, options, *reader, delta, temp, &stats);
  reader.reset();  // closes the delta's files before its directory moves
  if (s.ok()) {
    s = in_place ? SwapIntoPlace(fs, root, name, temp, delta.manifest_xxh3, &stats.swap)
                 : CommitInto(fs, target, name, temp);
  }
  if (!s.ok()) {
    RemoveTreeBestEffort(fs, temp);
    return s;
  }
  stats.dir = JoinPath(target, name);
  stats.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  Log(LogLevel::kInfo,
      absl::StrFormat("compacted step %d of %s into a full checkpoint at %s: %d bytes in %.2f s%s",
                      step, root, stats.dir, stats.file_bytes, stats.seconds,
                      stats.swap.empty() ? "" : absl::StrCat(" (", stats.swap, ")")));
  return stats;
}

}  // namespace

absl::StatusOr<CompactStats> CompactToFull(const std::string& root, int64_t step,
                                           const CompactOptions& options) {
  std::shared_ptr<FileSystem> fs = options.fs != nullptr ? options.fs : PosixFileSystem();
  // Under the retention lock, so that nothing reclaims the temp directory
  // as a dead job's (see ReclaimOrphans) and no retention job runs beside it.
  std::vector<std::unique_ptr<FileLock>> locks;
  if (!options.holds_retention_lock) {
    for (const std::string* r : {&root, &options.target_root}) {
      if (r->empty()) continue;
      auto lock = LockRoot(*r, RootLockKind::kRetention, "ckpt compaction", fs.get());
      if (!lock.ok()) {
        return Annotate(lock.status(), absl::StrCat("compacting step ", step, " of ", root));
      }
      locks.push_back(std::move(*lock));
    }
  }
  auto stats = Compact(*fs, fs, root, step, options);
  if (!stats.ok()) {
    return Annotate(stats.status(), absl::StrCat("compacting step ", step, " of ", root));
  }
  return stats;
}

}  // namespace ckpt
