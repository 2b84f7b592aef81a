#include "io/small_file.h"

#include "absl/strings/str_cat.h"
#include "util/path.h"
#include "util/status_macros.h"

namespace ckpt::internal {

absl::StatusOr<std::string> ReadSmallFile(FileSystem& fs, const std::string& path,
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
  CKPT_ASSIGN_OR_RETURN(size_t read, file->ReadAt(0, std::span<char>(contents)));
  if (read < size) {
    return absl::DataLossError(absl::StrCat("read ", path, ": unexpected end of file after ", read,
                                            " of ", size, " bytes (file truncated?)"));
  }
  CKPT_RETURN_IF_ERROR(file->Close());
  return contents;
}

absl::Status WriteFileDurably(FileSystem& fs, const std::string& path, absl::string_view contents) {
  OpenOptions options;
  options.write = true;
  options.create = true;
  options.exclusive = true;
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<File> file, fs.Open(path, options));
  CKPT_RETURN_IF_ERROR(file->WriteAt(0, std::span<const char>(contents.data(), contents.size())));
  CKPT_RETURN_IF_ERROR(file->Sync());
  return file->Close();
}

absl::Status RemoveFileTree(FileSystem& fs, const std::string& path) {
  CKPT_ASSIGN_OR_RETURN(const FileStat stat, fs.Stat(path));
  if (stat.is_symlink || !stat.is_directory) return fs.RemoveFile(path);
  CKPT_ASSIGN_OR_RETURN(std::vector<std::string> names, fs.ListDir(path));
  for (const std::string& name : names) {
    absl::Status s = RemoveFileTree(fs, JoinPath(path, name));
    if (!s.ok() && !absl::IsNotFound(s)) return s;  // gone meanwhile is fine
  }
  return fs.RemoveDir(path);
}

void RemoveTreeBestEffort(FileSystem& fs, const std::string& path) { (void)RemoveFileTree(fs, path); }

}  // namespace ckpt::internal
