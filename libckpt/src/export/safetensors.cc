#include "ckpt/safetensors.h"

#include <algorithm>
#include <set>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "commit/publish.h"
#include "ckpt/maintenance.h"
#include "export/safetensors_header.h"
#include "format/names.h"
#include "io/io_executor.h"
#include "nlohmann/json.hpp"
#include "util/status_macros.h"

namespace ckpt {
namespace {

const char* SafetensorsDType(DType dtype) {
  switch (dtype) {
    case DType::kBool: return "BOOL";
    case DType::kUInt8: return "U8";
    case DType::kInt8: return "I8";
    case DType::kInt16: return "I16";
    case DType::kInt32: return "I32";
    case DType::kInt64: return "I64";
    case DType::kUInt16: return "U16";
    case DType::kUInt32: return "U32";
    case DType::kUInt64: return "U64";
    case DType::kFloat16: return "F16";
    case DType::kBFloat16: return "BF16";
    case DType::kFloat32: return "F32";
    case DType::kFloat64: return "F64";
    case DType::kComplex64: return "C64";
    case DType::kFloat8E4M3Fn: return "F8_E4M3";
    case DType::kFloat8E5M2: return "F8_E5M2";
    case DType::kFloat8E4M3Fnuz: return "F8_E4M3FNUZ";
    case DType::kFloat8E5M2Fnuz: return "F8_E5M2FNUZ";
    case DType::kFloat8E8M0Fnu: return "F8_E8M0";
    case DType::kComplex128: return nullptr;  // safetensors has no 128-bit complex
  }
  return nullptr;
}

// Writes `n` bytes at `offset` of `file` and waits for them (short writes
// and EINTR resubmitted; ENOSPC is kResourceExhausted). Through the queue,
// not `File::WriteAt`: a tensor may be gigabytes.
absl::Status WriteThroughQueue(IoQueue& queue, File& file, uint64_t offset, const void* data,
                               size_t n) {
  internal::IoExecutor io(&queue, size_t{8} << 20);
  CKPT_RETURN_IF_ERROR(io.Start(IoOp::Kind::kWrite, &file, offset, const_cast<void*>(data), n, 0));
  return io.Drain();
}

}  // namespace

absl::StatusOr<std::string> SafetensorsHeader(const std::vector<const TensorInfo*>& tensors,
                                              int64_t step, absl::string_view extras_json) {
  return internal::SafetensorsHeaderWith(tensors, {{"format", "pt"},
                                                   {"ckpt_step", absl::StrCat(step)},
                                                   {"ckpt_extras", std::string(extras_json)}});
}

namespace internal {

absl::StatusOr<std::string> SafetensorsHeaderWith(
    const std::vector<const TensorInfo*>& tensors,
    const std::vector<std::pair<std::string, std::string>>& metadata) {
  nlohmann::ordered_json header;
  header["__metadata__"] = nlohmann::ordered_json::object();
  for (const auto& [key, value] : metadata) header["__metadata__"][key] = value;
  std::set<absl::string_view> names;
  uint64_t offset = 0;
  for (const TensorInfo* t : tensors) {
    const char* dtype = SafetensorsDType(t->dtype);
    if (dtype == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", absl::CHexEscape(t->name), "\" is ", DTypeName(t->dtype),
                       ", which safetensors cannot name"));
    }
    if (t->name == "__metadata__" || !names.insert(t->name).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor \"", absl::CHexEscape(t->name), "\" cannot be a safetensors entry: ",
          t->name == "__metadata__" ? "the name is reserved" : "the name appears twice"));
    }
    uint64_t numel = 1;
    for (int64_t d : t->shape) {
      if (d < 0 || (d != 0 && numel > UINT64_MAX / static_cast<uint64_t>(d))) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor \"", absl::CHexEscape(t->name), "\" has an impossible shape"));
      }
      numel *= static_cast<uint64_t>(d);
    }
    const size_t element = DTypeSize(t->dtype);
    if (element == 0 || numel > UINT64_MAX / element || numel * element != t->raw_bytes ||
        t->raw_bytes > UINT64_MAX - offset) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", absl::CHexEscape(t->name), "\" has ",
                                                     t->raw_bytes, " bytes, which its shape does not hold"));
    }
    header[t->name] = {{"dtype", dtype},
                       {"shape", t->shape},
                       {"data_offsets", {offset, offset + t->raw_bytes}}};
    offset += t->raw_bytes;
  }
  std::string text;
  try {
    text = header.dump(-1, ' ', false, nlohmann::json::error_handler_t::strict);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("a tensor name or the metadata is not valid UTF-8: ", e.what()));
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(uint64_t{text.size()} >> (8 * i));
  out += text;
  return out;
}

}  // namespace internal

absl::StatusOr<ExportResult> ExportSafetensors(
    Reader& reader, const std::string& prefix, const std::string& path,
    const std::function<void(uint64_t done, uint64_t total)>& progress,
    std::shared_ptr<FileSystem> fs) {
  if (fs == nullptr) fs = PosixFileSystem();
  if (absl::StatusOr<FileStat> there = fs->Stat(path); there.ok()) {
    return absl::AlreadyExistsError(absl::StrCat(path, " exists; not overwriting it"));
  } else if (!absl::IsNotFound(there.status())) {
    return there.status();
  }
  std::vector<const TensorInfo*> selected;
  uint64_t total = 0, largest = 0;
  for (const TensorInfo& t : reader.tensors()) {
    if (!absl::StartsWith(t.name, prefix)) continue;
    selected.push_back(&t);
    total += t.raw_bytes;
    largest = std::max(largest, t.raw_bytes);
  }
  if (selected.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("no tensor name starts with \"", prefix, "\""));
  }
  absl::StatusOr<std::string> header = SafetensorsHeader(selected, reader.step(), reader.extras_json());
  if (!header.ok()) return header.status();
  if (progress) progress(0, total);

  absl::StatusOr<std::unique_ptr<IoQueue>> queue = fs->NewIoQueue(IoQueueKind::kThreads, 1);
  if (!queue.ok()) return queue.status();
  absl::StatusOr<AlignedBytes> buffer = AlignedBytes::Allocate(largest, /*prefault=*/false);
  if (!buffer.ok()) return buffer.status();

  const std::string temp = internal::UniqueName(path, ".tmp-ckpt-export");
  OpenOptions create;
  create.write = true;
  create.create = true;
  create.exclusive = true;
  absl::StatusOr<std::unique_ptr<File>> file = fs->Open(temp, create);
  if (!file.ok()) return file.status();
  absl::Status status;
  const uint64_t file_bytes = header->size() + total;
  if (absl::Status s = (*file)->Allocate(file_bytes); !s.ok() && !absl::IsUnimplemented(s)) {
    status = s;  // a full disk fails here, before anything is read
  }
  if (status.ok()) status = WriteThroughQueue(**queue, **file, 0, header->data(), header->size());
  uint64_t offset = header->size(), written = 0;
  for (size_t i = 0; i < selected.size() && status.ok(); ++i) {
    const TensorInfo& t = *selected[i];
    ReadTarget target{t.name, buffer->data(), buffer->size()};
    status = reader.ReadInto({&target, 1});  // resolves deltas, checks every checksum
    if (status.ok()) {
      status = WriteThroughQueue(**queue, **file, offset, buffer->data(), t.raw_bytes);
    }
    offset += t.raw_bytes;
    written += t.raw_bytes;
    if (status.ok() && progress) progress(written, total);
  }
  if (status.ok()) status = (*file)->Sync();
  if (absl::Status closed = (*file)->Close(); status.ok()) status = closed;
  if (status.ok()) status = internal::PublishFile(*fs, temp, path);
  if (!status.ok()) {
    (void)fs->RemoveFile(temp);  // (gone already when published)
    return status;
  }
  return ExportResult{selected.size(), file_bytes};
}

}  // namespace ckpt
