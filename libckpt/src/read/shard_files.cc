#include "read/shard_files.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "format/names.h"
#include "util/log.h"

namespace ckpt::internal {

absl::StatusOr<File*> ShardFiles::Get(const std::string& dir, const std::string& shard) {
  const std::string path = JoinPath(dir, shard);
  auto it = files_.find(path);
  if (it != files_.end()) return it->second.get();
  OpenOptions options;
  options.direct = backend_.direct;
  options.regular_only = true;
  auto file = fs_->Open(path, options);
  if (!file.ok() && options.direct && file.status().code() == absl::StatusCode::kInvalidArgument &&
      io_.direct == DirectIoMode::kAuto) {
    Log(LogLevel::kInfo, absl::StrCat(dir, " refuses O_DIRECT; reading buffered"));
    backend_.direct = false;
    options.direct = false;
    file = fs_->Open(path, options);
  }
  if (!file.ok()) return file.status();
  return (files_[path] = std::move(*file)).get();
}

}  // namespace ckpt::internal
