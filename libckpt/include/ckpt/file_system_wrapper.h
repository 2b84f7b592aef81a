// ckpt/file_system_wrapper.h: a `FileSystem` that forwards every call to
// another one (LevelDB's EnvWrapper, RocksDB's FileSystemWrapper). Derive
// from it to change a few calls -- count them, fail them, time them, send
// them elsewhere -- and inherit the rest:
//
//   class CountingFileSystem : public ckpt::FileSystemWrapper {
//    public:
//     using FileSystemWrapper::FileSystemWrapper;
//     absl::Status SyncDir(const std::string& path) override {
//       ++dir_syncs_;
//       return FileSystemWrapper::SyncDir(path);
//     }
//     int dir_syncs_ = 0;
//   };
//
// A new file-system implementation proves itself with the conformance suite
// (tests/conformance/file_system_conformance.h, `RunFileSystemConformance`).
#ifndef CKPT_FILE_SYSTEM_WRAPPER_H_
#define CKPT_FILE_SYSTEM_WRAPPER_H_

#include <memory>
#include <string>
#include <vector>

#include "ckpt/file_system.h"

namespace ckpt {

class FileSystemWrapper : public FileSystem {
 public:
  // REQUIRES: `target` is not null.
  explicit FileSystemWrapper(std::shared_ptr<FileSystem> target) : target_(std::move(target)) {}

  // The file system calls are forwarded to.
  FileSystem& target() const { return *target_; }
  const std::shared_ptr<FileSystem>& shared_target() const { return target_; }

  absl::string_view name() const override { return target_->name(); }
  absl::StatusOr<std::unique_ptr<File>> Open(const std::string& path,
                                             const OpenOptions& options) override {
    return target_->Open(path, options);
  }
  absl::Status CreateDir(const std::string& path) override { return target_->CreateDir(path); }
  absl::Status RemoveFile(const std::string& path) override { return target_->RemoveFile(path); }
  absl::Status RemoveDir(const std::string& path) override { return target_->RemoveDir(path); }
  absl::Status Rename(const std::string& from, const std::string& to, RenameMode mode) override {
    return target_->Rename(from, to, mode);
  }
  absl::Status Exchange(const std::string& a, const std::string& b) override {
    return target_->Exchange(a, b);
  }
  absl::Status SyncDir(const std::string& path) override { return target_->SyncDir(path); }
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) override {
    return target_->ListDir(path);
  }
  absl::StatusOr<FileStat> Stat(const std::string& path) override { return target_->Stat(path); }
  absl::StatusOr<std::unique_ptr<FileLock>> LockFile(const std::string& path,
                                                     absl::string_view owner) override {
    return target_->LockFile(path, owner);
  }
  absl::StatusOr<std::unique_ptr<IoQueue>> NewIoQueue(IoQueueKind kind, size_t depth) override {
    return target_->NewIoQueue(kind, depth);
  }

 private:
  const std::shared_ptr<FileSystem> target_;
};

}  // namespace ckpt

#endif  // CKPT_FILE_SYSTEM_WRAPPER_H_
