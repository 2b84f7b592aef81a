#include "safetensors_export.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace ckpt::tools {
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
  }
  return "";
}

absl::Status Errno(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

// Renames `temp` to `path` unless `path` exists (checked atomically: a file
// created meanwhile is never overwritten), then fsyncs the directory.
absl::Status PublishNoReplace(const std::string& temp, const std::string& path) {
  if (::renameat2(AT_FDCWD, temp.c_str(), AT_FDCWD, path.c_str(), RENAME_NOREPLACE) != 0) {
    if (errno != EINVAL && errno != ENOSYS) return Errno("rename to " + path);
    // No RENAME_NOREPLACE on this file system: link() fails on an existing name too.
    if (::link(temp.c_str(), path.c_str()) != 0) return Errno("link to " + path);
    ::unlink(temp.c_str());
  }
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Errno("open directory " + dir);
  absl::Status status;
  if (::fsync(fd) != 0) status = Errno("fsync directory " + dir);
  ::close(fd);
  return status;
}

// Writes all of `n` bytes, retrying short writes and EINTR.
absl::Status WriteAll(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return Errno("write " + path);
    if (w == 0) return absl::ResourceExhaustedError("write " + path + ": no space left");
    p += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ExportResult> ExportSafetensors(
    Reader& reader, const std::string& prefix, const std::string& path,
    const std::function<void(uint64_t done, uint64_t total)>& progress) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) {
    return absl::AlreadyExistsError(absl::StrCat(path, " exists; not overwriting it"));
  }
  std::vector<const TensorInfo*> selected;
  for (const TensorInfo& t : reader.tensors()) {
    if (absl::StartsWith(t.name, prefix)) selected.push_back(&t);
  }
  if (selected.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("no tensor name starts with \"", prefix, "\""));
  }
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"},
                            {"ckpt_step", absl::StrCat(reader.step())},
                            {"ckpt_extras", reader.extras_json()}};
  uint64_t offset = 0;
  uint64_t largest = 0;
  for (const TensorInfo* t : selected) {
    header[t->name] = {{"dtype", SafetensorsDType(t->dtype)},
                       {"shape", t->shape},
                       {"data_offsets", {offset, offset + t->raw_bytes}}};
    offset += t->raw_bytes;
    largest = std::max(largest, t->raw_bytes);
  }
  if (progress) progress(0, offset);
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  unsigned char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(uint64_t{text.size()} >> (8 * i));

  const std::string temp = path + ".tmp-ckpt-export";
  int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("create " + temp);
  absl::Status status = WriteAll(fd, length, 8, temp);
  if (status.ok()) status = WriteAll(fd, text.data(), text.size(), temp);
  auto buffer = AlignedBytes::Allocate(largest, /*prefault=*/false);
  if (!buffer.ok()) status = buffer.status();
  uint64_t written = 0;  // tensor bytes
  for (size_t i = 0; i < selected.size() && status.ok(); ++i) {
    const TensorInfo& t = *selected[i];
    ReadTarget target{t.name, buffer->data(), buffer->size()};
    status = reader.ReadInto({&target, 1});  // resolves deltas, checks every checksum
    if (status.ok()) status = WriteAll(fd, buffer->data(), t.raw_bytes, temp);
    written += t.raw_bytes;
    if (status.ok() && progress) progress(written, offset);
  }
  if (status.ok() && ::fsync(fd) != 0) status = Errno("fsync " + temp);
  if (::close(fd) != 0 && status.ok()) status = Errno("close " + temp);
  if (status.ok()) status = PublishNoReplace(temp, path);
  if (!status.ok()) {
    ::unlink(temp.c_str());
    return status;
  }
  return ExportResult{selected.size(), 8 + text.size() + offset};
}

}  // namespace ckpt::tools
