#include "io/small_file.h"

#include "absl/strings/str_cat.h"
#include "ckpt/maintenance.h"
#include "format/names.h"
#include "io/io_executor.h"
#include "util/status_macros.h"

namespace ckpt::internal {

absl::StatusOr<std::string> ReadSmallFile(FileSystem& fs, IoQueue& queue, const std::string& path,
                                          uint64_t max_bytes) {
  OpenOptions options;
  options.regular_only = true;
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<File> file, fs.Open(path, options));
  CKPT_ASSIGN_OR_RETURN(uint64_t size, file->Size());
  if (size > max_bytes) {
    return absl::DataLossError(absl::StrCat(path, " is ", size, " bytes, more than the ",
                                            max_bytes, " allowed"));
  }
  std::string contents(size, '\0');
  {
    IoExecutor io(&queue, size_t{1} << 20);
    CKPT_RETURN_IF_ERROR(io.Start(IoOp::Kind::kRead, file.get(), 0, contents.data(), size, 0));
    CKPT_RETURN_IF_ERROR(io.Drain());
  }
  CKPT_RETURN_IF_ERROR(file->Close());
  return contents;
}

absl::Status WriteFileDurably(FileSystem& fs, IoQueue& queue, const std::string& path,
                              absl::string_view contents) {
  OpenOptions options;
  options.write = true;
  options.create = true;
  options.exclusive = true;
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<File> file, fs.Open(path, options));
  {
    IoExecutor io(&queue, size_t{1} << 20);
    CKPT_RETURN_IF_ERROR(io.Start(IoOp::Kind::kWrite, file.get(), 0,
                                  const_cast<char*>(contents.data()), contents.size(), 0));
    CKPT_RETURN_IF_ERROR(io.Drain());
  }
  CKPT_RETURN_IF_ERROR(file->Sync());
  return file->Close();
}

void RemoveTreeBestEffort(FileSystem& fs, const std::string& path) { (void)RemoveTree(fs, path); }

}  // namespace ckpt::internal
