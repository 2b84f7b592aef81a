// `ExportHuggingFace`: a checkpoint step as a Hugging Face model directory.
// The tensors are selected and renamed, cut into shards as transformers cuts
// them, each shard written as a safetensors file through the seam's I/O
// queue (converted to the requested dtype on the way), then the index and
// the copied files; the directory is built beside its final name and
// renamed into place.
#include "ckpt/hf_export.h"

#include <algorithm>
#include <cctype>
#include <set>
#include <span>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "export/float_convert.h"
#include "export/safetensors_header.h"
#include "format/names.h"
#include "io/io_executor.h"
#include "io/small_file.h"
#include "nlohmann/json.hpp"
#include "util/status_macros.h"

namespace ckpt {
namespace {

using internal::JoinPath;

constexpr char kIndexName[] = "model.safetensors.index.json";
constexpr uint64_t kMaxCopiedFileBytes = uint64_t{4} << 30;

// One tensor as it is written: its record, its name and dtype in the export.
struct Exported {
  const TensorInfo* info = nullptr;
  TensorInfo out;  // name, dtype, shape and raw_bytes as written
};

// Consecutive tensors of one shard file.
struct Shard {
  size_t begin = 0, end = 0;
  std::string file;
};

std::string ParentOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string BaseName(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

absl::StatusOr<std::vector<Exported>> Select(const Reader& reader, const HfExportOptions& options) {
  std::vector<Exported> out;
  std::set<std::string> names;
  for (const TensorInfo& t : reader.tensors()) {
    if (!absl::StartsWith(t.name, options.filter) || !absl::StartsWith(t.name, options.strip_prefix)) {
      continue;
    }
    Exported e{&t, t};
    e.out.name = t.name.substr(options.strip_prefix.size());
    if (options.dtype.has_value() && IsFloatingDType(t.dtype)) {
      e.out.dtype = *options.dtype;
      e.out.raw_bytes = t.raw_bytes / DTypeSize(t.dtype) * DTypeSize(*options.dtype);
    }
    if (e.out.name.empty() || !names.insert(e.out.name).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor \"", t.name, "\" would be written as \"", e.out.name, "\", ",
          e.out.name.empty() ? "an empty name" : "a name another tensor takes too"));
    }
    out.push_back(std::move(e));
  }
  if (out.empty()) {
    std::vector<std::string> prefixes;
    for (const std::string* p : {&options.strip_prefix, &options.filter}) {
      if (!p->empty()) prefixes.push_back(absl::StrCat("\"", *p, "\""));
    }
    return absl::InvalidArgumentError(
        prefixes.empty() ? "the checkpoint holds no tensor"
                         : absl::StrCat("no tensor name starts with ", absl::StrJoin(prefixes, " and ")));
  }
  return out;
}

// As transformers (huggingface_hub's split_torch_state_dict_into_shards):
// in order, a new shard when the next tensor would take the current one past
// `max_bytes`; a tensor larger than that alone in a shard of its own.
std::vector<Shard> PlanShards(const std::vector<Exported>& tensors, uint64_t max_bytes) {
  std::vector<Shard> shards;
  uint64_t bytes = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const uint64_t size = tensors[i].out.raw_bytes;
    if (shards.empty() || (bytes + size > max_bytes && bytes > 0)) {
      shards.push_back(Shard{i, i, ""});
      bytes = 0;
    }
    shards.back().end = i + 1;
    bytes += size;
  }
  for (size_t s = 0; s < shards.size(); ++s) {
    shards[s].file = shards.size() == 1 ? "model.safetensors"
                                        : absl::StrFormat("model-%05d-of-%05d.safetensors", s + 1, shards.size());
  }
  return shards;
}

// Writes `n` bytes at `offset` of `file` through `queue` and waits for them.
absl::Status WriteThroughQueue(IoQueue& queue, File& file, uint64_t offset, const void* data, size_t n) {
  internal::IoExecutor io(&queue, size_t{8} << 20);
  CKPT_RETURN_IF_ERROR(io.Start(IoOp::Kind::kWrite, &file, offset, const_cast<void*>(data), n, 0));
  return io.Drain();
}

class ShardWriter {
 public:
  ShardWriter(Reader& reader, FileSystem& fs, IoQueue& queue, AlignedBytes& in, AlignedBytes& out,
              const std::function<void(uint64_t)>& wrote)
      : reader_(reader), fs_(fs), queue_(queue), in_(in), out_(out), wrote_(wrote) {}

  // Writes `tensors` as the safetensors file `path`, fsynced.
  absl::Status Write(const std::string& path, std::span<const Exported> tensors) {
    std::vector<const TensorInfo*> infos;
    uint64_t total = 0;
    for (const Exported& e : tensors) {
      infos.push_back(&e.out);
      total += e.out.raw_bytes;
    }
    CKPT_ASSIGN_OR_RETURN(std::string header, internal::SafetensorsHeaderWith(infos, {{"format", "pt"}}));
    OpenOptions create;
    create.write = create.create = create.exclusive = true;
    CKPT_ASSIGN_OR_RETURN(std::unique_ptr<File> file, fs_.Open(path, create));
    absl::Status status = WriteAll(*file, header, total, tensors);
    if (status.ok()) status = file->Sync();
    if (absl::Status closed = file->Close(); status.ok()) status = closed;
    return status;
  }

 private:
  absl::Status WriteAll(File& file, const std::string& header, uint64_t total,
                        std::span<const Exported> tensors) {
    if (absl::Status s = file.Allocate(header.size() + total); !s.ok() && !absl::IsUnimplemented(s)) {
      return s;  // a full disk fails here, before anything is read
    }
    CKPT_RETURN_IF_ERROR(WriteThroughQueue(queue_, file, 0, header.data(), header.size()));
    uint64_t offset = header.size();
    for (const Exported& e : tensors) {
      ReadTarget target{e.info->name, in_.data(), in_.size()};
      CKPT_RETURN_IF_ERROR(reader_.ReadInto({&target, 1}));  // deltas resolved, checksums checked
      const void* bytes = in_.data();
      if (e.out.dtype != e.info->dtype) {
        CKPT_RETURN_IF_ERROR(internal::ConvertFloats(e.info->dtype, in_.data(), e.out.dtype, out_.data(),
                                                     e.info->raw_bytes / DTypeSize(e.info->dtype)));
        bytes = out_.data();
      }
      CKPT_RETURN_IF_ERROR(WriteThroughQueue(queue_, file, offset, bytes, e.out.raw_bytes));
      offset += e.out.raw_bytes;
      wrote_(e.out.raw_bytes);
    }
    return absl::OkStatus();
  }

  Reader& reader_;
  FileSystem& fs_;
  IoQueue& queue_;
  AlignedBytes& in_;
  AlignedBytes& out_;
  const std::function<void(uint64_t)>& wrote_;
};

std::string IndexJson(const std::vector<Exported>& tensors, const std::vector<Shard>& shards) {
  nlohmann::ordered_json index;
  uint64_t bytes = 0, elements = 0;
  std::vector<std::pair<std::string, std::string>> map;
  for (const Shard& s : shards) {
    for (size_t i = s.begin; i < s.end; ++i) {
      bytes += tensors[i].out.raw_bytes;
      elements += tensors[i].out.raw_bytes / DTypeSize(tensors[i].out.dtype);
      map.emplace_back(tensors[i].out.name, s.file);
    }
  }
  std::sort(map.begin(), map.end());  // (transformers writes the map sorted by name)
  index["metadata"] = {{"total_size", bytes}, {"total_parameters", elements}};
  index["weight_map"] = nlohmann::ordered_json::object();
  for (const auto& [name, file] : map) index["weight_map"][name] = file;
  return index.dump(2) + "\n";
}

// Checks everything that can be checked before a byte is written.
absl::Status CheckRequest(FileSystem& fs, const std::string& dir, const HfExportOptions& options) {
  if (options.max_shard_bytes == 0) return absl::InvalidArgumentError("the largest shard size must be > 0");
  if (options.dtype.has_value() && !IsFloatingDType(*options.dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("tensors convert only to a floating dtype, not ",
                                                   DTypeName(*options.dtype)));
  }
  if (absl::StatusOr<FileStat> there = fs.Stat(dir); there.ok()) {
    return absl::AlreadyExistsError(absl::StrCat(dir, " exists; not overwriting it"));
  } else if (!absl::IsNotFound(there.status())) {
    return there.status();
  }
  std::set<std::string> names = {kIndexName, "model.safetensors"};
  for (const std::string& path : options.copy_files) {
    if (absl::Status there = fs.Stat(path).status(); !there.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("cannot copy ", path, " into the export: ", there.message()));
    }
    if (absl::EndsWith(BaseName(path), ".safetensors") || !names.insert(BaseName(path)).second ||
        BaseName(path).empty()) {
      return absl::InvalidArgumentError(absl::StrCat("cannot copy ", path, " into the export: its name \"",
                                                     BaseName(path), "\" is taken or is a weights file's"));
    }
  }
  return absl::OkStatus();
}

// Writes the shards, the index and the copies into the new directory `temp`.
absl::StatusOr<HfExportResult> WriteDirectory(Reader& reader, FileSystem& fs, const std::string& temp,
                                              const std::vector<Exported>& tensors,
                                              const std::vector<Shard>& shards, const HfExportOptions& options,
                                              const std::function<void(uint64_t)>& wrote) {
  uint64_t largest_in = 0, largest_out = 0, total = 0;
  for (const Exported& e : tensors) {
    largest_in = std::max(largest_in, e.info->raw_bytes);
    if (e.out.dtype != e.info->dtype) largest_out = std::max(largest_out, e.out.raw_bytes);
    total += e.out.raw_bytes;
  }
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<IoQueue> queue, fs.NewIoQueue(IoQueueKind::kThreads, 1));
  CKPT_ASSIGN_OR_RETURN(AlignedBytes in, AlignedBytes::Allocate(largest_in, /*prefault=*/false));
  CKPT_ASSIGN_OR_RETURN(AlignedBytes out, AlignedBytes::Allocate(largest_out, /*prefault=*/false));
  ShardWriter writer(reader, fs, *queue, in, out, wrote);
  for (const Shard& s : shards) {
    CKPT_RETURN_IF_ERROR(writer.Write(JoinPath(temp, s.file),
                                      std::span<const Exported>(tensors).subspan(s.begin, s.end - s.begin)));
  }
  if (shards.size() > 1) {
    CKPT_RETURN_IF_ERROR(internal::WriteFileDurably(fs, JoinPath(temp, kIndexName), IndexJson(tensors, shards)));
  }
  for (const std::string& path : options.copy_files) {
    CKPT_ASSIGN_OR_RETURN(std::string text, internal::ReadSmallFile(fs, path, kMaxCopiedFileBytes));
    CKPT_RETURN_IF_ERROR(internal::WriteFileDurably(fs, JoinPath(temp, BaseName(path)), text));
  }
  CKPT_RETURN_IF_ERROR(fs.SyncDir(temp));
  return HfExportResult{tensors.size(), shards.size(), total};
}

}  // namespace

absl::StatusOr<uint64_t> ParseShardSize(absl::string_view text) {
  const std::string lower = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  size_t digits = 0;
  while (digits < lower.size() && std::isdigit(static_cast<unsigned char>(lower[digits]))) ++digits;
  const std::string unit(absl::StripAsciiWhitespace(absl::string_view(lower).substr(digits)));
  static const std::pair<const char*, uint64_t> kUnits[] = {
      {"", 1}, {"b", 1}, {"kb", 1000}, {"mb", 1000'000}, {"gb", 1000'000'000}, {"tb", 1000'000'000'000},
      {"kib", uint64_t{1} << 10}, {"mib", uint64_t{1} << 20}, {"gib", uint64_t{1} << 30},
      {"tib", uint64_t{1} << 40}};
  uint64_t number = 0;
  if (digits > 0 && absl::SimpleAtoi(lower.substr(0, digits), &number) && number > 0) {
    for (const auto& [name, scale] : kUnits) {
      if (unit == name && number <= UINT64_MAX / scale) return number * scale;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "\"", text, "\" is not a shard size (bytes > 0, or a number with KB, MB, GB, TB, KiB, MiB, GiB or TiB)"));
}

absl::StatusOr<HfExportResult> ExportHuggingFace(Reader& reader, const std::string& dir_as_given,
                                                 const HfExportOptions& options,
                                                 const std::function<void(uint64_t, uint64_t)>& progress,
                                                 std::shared_ptr<FileSystem> fs) {
  if (fs == nullptr) fs = PosixFileSystem();
  std::string dir = dir_as_given;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  CKPT_RETURN_IF_ERROR(CheckRequest(*fs, dir, options));
  CKPT_ASSIGN_OR_RETURN(std::vector<Exported> tensors, Select(reader, options));
  const std::vector<Shard> shards = PlanShards(tensors, options.max_shard_bytes);
  uint64_t total = 0, done = 0;
  for (const Exported& e : tensors) total += e.out.raw_bytes;
  if (progress) progress(0, total);
  const std::function<void(uint64_t)> wrote = [&](uint64_t bytes) {
    done += bytes;
    if (progress) progress(done, total);
  };
  const std::string temp = internal::UniqueName(dir, ".tmp-ckpt-export");
  CKPT_RETURN_IF_ERROR(fs->CreateDir(temp));
  absl::StatusOr<HfExportResult> result = WriteDirectory(reader, *fs, temp, tensors, shards, options, wrote);
  absl::Status status = result.status();
  if (status.ok()) status = fs->Rename(temp, dir, RenameMode::kNoReplace);
  if (!status.ok()) {
    internal::RemoveTreeBestEffort(*fs, temp);
    return status;
  }
  if (absl::Status synced = fs->SyncDir(ParentOf(dir)); !synced.ok()) {
    // Its name might not survive a power loss: take it back, so that an
    // error always means nothing was left (the caller can simply retry).
    internal::RemoveTreeBestEffort(*fs, dir);
    return synced;
  }
  return result;
}

}  // namespace ckpt
