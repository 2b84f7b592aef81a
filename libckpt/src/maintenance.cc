#include "ckpt/maintenance.h"

#include <algorithm>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "ckpt/root_lock.h"
#include "ckpt/tensor.h"
#include "commit/publish.h"
#include "compact/swap.h"
#include "format/names.h"
#include "io/io_executor.h"
#include "io/small_file.h"
#include "util/hash.h"
#include "util/status_macros.h"

namespace ckpt {
namespace {

using internal::JoinPath;

// ROOT/.tmp-copy-step-…-<hex>: a `CopyCheckpoint` into ROOT being written.
constexpr absl::string_view kCopyTempPrefix = ".tmp-copy-";

// Files are copied in pieces of this size (one read, one write at a time).
constexpr size_t kCopyPieceBytes = size_t{8} << 20;

std::shared_ptr<FileSystem> OrPosix(std::shared_ptr<FileSystem> fs) {
  return fs != nullptr ? std::move(fs) : PosixFileSystem();
}

// Reads `file` (whose size is `size`) front to back in pieces into
// `buffer`, calling `piece(offset, data, n)` for each; returns the XXH3 of it all.
template <typename OnPiece>
absl::StatusOr<uint64_t> StreamFile(IoQueue& queue, File& file, uint64_t size, AlignedBytes& buffer,
                                    const OnPiece& piece) {
  internal::Xxh3Stream hash;
  for (uint64_t offset = 0; offset < size;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(buffer.size(), size - offset));
    {
      internal::IoExecutor io(&queue, kCopyPieceBytes);
      CKPT_RETURN_IF_ERROR(io.Start(IoOp::Kind::kRead, &file, offset, buffer.data(), n, 0));
      CKPT_RETURN_IF_ERROR(io.Drain());
    }
    hash.Update(buffer.data(), n);
    CKPT_RETURN_IF_ERROR(piece(offset, buffer.data(), n));
    offset += n;
  }
  return hash.Digest();
}

// Copies the regular file `from` to the new file `to` (fsynced, closed) and
// returns its size after checking that `to` reads back as `from` did.
absl::StatusOr<uint64_t> CopyFileVerified(FileSystem& fs, IoQueue& queue, const std::string& from,
                                          const std::string& to, AlignedBytes& buffer) {
  OpenOptions read;
  read.regular_only = true;
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<File> source, fs.Open(from, read));
  CKPT_ASSIGN_OR_RETURN(const uint64_t size, source->Size());
  OpenOptions write;
  write.write = true;
  write.create = true;
  write.exclusive = true;
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<File> target, fs.Open(to, write));
  if (size > 0) {
    // Reserve the blocks first: a full target fails here, before any write.
    absl::Status reserved = target->Allocate(size);
    if (!reserved.ok() && !absl::IsUnimplemented(reserved)) return reserved;
  }
  CKPT_ASSIGN_OR_RETURN(
      const uint64_t source_hash,
      StreamFile(queue, *source, size, buffer,
                 [&](uint64_t offset, void* data, size_t n) -> absl::Status {
                   internal::IoExecutor io(&queue, kCopyPieceBytes);
                   CKPT_RETURN_IF_ERROR(io.Start(IoOp::Kind::kWrite, target.get(), offset, data, n, 0));
                   return io.Drain();
                 }));
  CKPT_RETURN_IF_ERROR(source->Close());
  CKPT_RETURN_IF_ERROR(target->Sync());
  CKPT_RETURN_IF_ERROR(target->Close());

  // Read the copy back, from the disk where the file system lets us drop
  // its cached pages.
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<File> copy, fs.Open(to, read));
  (void)copy->DropCache();
  CKPT_ASSIGN_OR_RETURN(const uint64_t copy_size, copy->Size());
  if (copy_size != size) {
    return absl::DataLossError(absl::StrCat("copy ", to, " of ", from, " is ", copy_size,
                                            " bytes after fsync, not ", size));
  }
  CKPT_ASSIGN_OR_RETURN(const uint64_t copy_hash,
                        StreamFile(queue, *copy, size, buffer,
                                   [](uint64_t, void*, size_t) { return absl::OkStatus(); }));
  CKPT_RETURN_IF_ERROR(copy->Close());
  if (copy_hash != source_hash) {
    return absl::DataLossError(absl::StrCat("copy ", to, " of ", from,
                                            " does not read back as written (XXH3 ",
                                            internal::HashToHex(copy_hash), ", expected ",
                                            internal::HashToHex(source_hash), ")"));
  }
  return size;
}

}  // namespace

RootEntryKind ClassifyRootEntry(absl::string_view name) {
  if (internal::ParseCheckpointDirName(name).has_value()) return RootEntryKind::kCheckpoint;
  if (absl::StartsWith(name, ".tmp-step-")) return RootEntryKind::kSaveTemp;
  if (absl::StartsWith(name, internal::kCompactTempPrefix)) return RootEntryKind::kCompactTemp;
  if (absl::StartsWith(name, kCopyTempPrefix)) return RootEntryKind::kCopyTemp;
  if (absl::StartsWith(name, internal::kTempPrefix)) return RootEntryKind::kOtherTemp;
  if (absl::StartsWith(name, internal::kTrashPrefix)) return RootEntryKind::kTrash;
  if (absl::StartsWith(name, internal::kCompactAsidePrefix)) return RootEntryKind::kCompactAside;
  if (absl::StartsWith(name, ".ckpt-direct-probe-")) return RootEntryKind::kDirectProbe;
  if (name == internal::kLatestName || absl::StartsWith(name, ".LATEST.tmp-")) {
    return RootEntryKind::kLatest;
  }
  if (name == RootLockFileName(RootLockKind::kWriter) ||
      name == RootLockFileName(RootLockKind::kRetention)) {
    return RootEntryKind::kLock;
  }
  return RootEntryKind::kUnknown;
}

absl::string_view RootEntryKindName(RootEntryKind kind) {
  switch (kind) {
    case RootEntryKind::kCheckpoint: return "checkpoint";
    case RootEntryKind::kSaveTemp: return "save-temp";
    case RootEntryKind::kCompactTemp: return "compact-temp";
    case RootEntryKind::kCopyTemp: return "copy-temp";
    case RootEntryKind::kOtherTemp: return "temp";
    case RootEntryKind::kTrash: return "trash";
    case RootEntryKind::kCompactAside: return "compact-aside";
    case RootEntryKind::kDirectProbe: return "direct-probe";
    case RootEntryKind::kLatest: return "latest";
    case RootEntryKind::kLock: return "lock";
    case RootEntryKind::kUnknown: return "unknown";
  }
  return "unknown";
}

absl::Status RemoveTree(FileSystem& fs, const std::string& path) {
  return internal::RemoveFileTree(fs, path);
}

absl::Status RemoveCheckpoint(const std::string& root, int64_t step, std::shared_ptr<FileSystem> fs) {
  fs = OrPosix(std::move(fs));
  const std::string name = internal::CheckpointDirName(step);
  const std::string dir = JoinPath(root, name);
  CKPT_ASSIGN_OR_RETURN(const FileStat stat, fs->Stat(dir));
  if (stat.is_symlink || !stat.is_directory) {
    return absl::FailedPreconditionError(
        absl::StrCat(dir, " is not a checkpoint directory (", stat.is_symlink ? "a symlink" : "a file",
                     "); not removing it"));
  }
  CKPT_ASSIGN_OR_RETURN(const std::string trash, internal::UnpublishDir(*fs, root, dir, name));
  // From here on the checkpoint is invisible; what follows only frees space.
  absl::Status removed = RemoveTree(*fs, trash);
  if (!removed.ok()) {
    return absl::Status(removed.code(),
                        absl::StrCat("checkpoint ", dir, " is removed, but deleting its files from ",
                                     trash, " failed (ckpt-retain removes them later): ",
                                     removed.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<CopyStats> CopyCheckpoint(const std::string& root, int64_t step,
                                         const std::string& target_root,
                                         std::shared_ptr<FileSystem> fs) {
  fs = OrPosix(std::move(fs));
  const std::string name = internal::CheckpointDirName(step);
  const std::string source = JoinPath(root, name);
  const std::string final_dir = JoinPath(target_root, name);
  CKPT_ASSIGN_OR_RETURN(const FileStat stat, fs->Stat(source));
  if (stat.is_symlink || !stat.is_directory) {
    return absl::FailedPreconditionError(absl::StrCat(source, " is not a checkpoint directory"));
  }
  if (absl::StatusOr<FileStat> there = fs->Stat(final_dir); there.ok()) {
    return absl::AlreadyExistsError(absl::StrCat(final_dir, " already exists"));
  } else if (!absl::IsNotFound(there.status())) {
    return there.status();
  }
  CKPT_ASSIGN_OR_RETURN(std::vector<std::string> names, fs->ListDir(source));
  std::sort(names.begin(), names.end());
  for (const std::string& file : names) {
    if (!internal::IsSafeFileName(file)) {
      return absl::FailedPreconditionError(
          absl::StrCat(source, " holds an entry named \"", absl::CEscape(file),
                       "\", which no checkpoint writes; not copying it"));
    }
  }
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<IoQueue> queue, fs->NewIoQueue(IoQueueKind::kThreads, 2));
  CKPT_ASSIGN_OR_RETURN(AlignedBytes buffer, AlignedBytes::Allocate(kCopyPieceBytes, /*prefault=*/false));

  const std::string temp =
      JoinPath(target_root, internal::UniqueName(kCopyTempPrefix, name));
  CKPT_RETURN_IF_ERROR(fs->CreateDir(temp));
  CopyStats stats;
  absl::Status status;
  for (const std::string& file : names) {
    absl::StatusOr<uint64_t> bytes =
        CopyFileVerified(*fs, *queue, JoinPath(source, file), JoinPath(temp, file), buffer);
    if (!bytes.ok()) {
      status = bytes.status();
      break;
    }
    ++stats.files;
    stats.bytes += *bytes;
  }
  // A copy whose target root's fsync failed might vanish in a power loss:
  // `PublishDir` takes it back then, so the caller never deletes the source
  // on the strength of it.
  if (status.ok()) status = internal::PublishDir(*fs, target_root, temp, name);
  if (!status.ok()) {
    if (fs->Stat(temp).ok()) (void)RemoveTree(*fs, temp);
    return status;
  }
  return stats;
}

}  // namespace ckpt
