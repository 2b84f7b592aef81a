// The power-loss model of `FaultInjectionFileSystem`: what has not been made
// durable yet, and how to roll the real tree back to what a power loss would
// leave (see `FaultInjectionFileSystem::DropUnsyncedData` for the rules).
#ifndef CKPT_TESTING_FAULT_INJECTION_LOG_H_
#define CKPT_TESTING_FAULT_INJECTION_LOG_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "ckpt/file_system.h"

namespace ckpt::testing::fault_internal {

// A file opened for writing: where it is now and how much of it is durable.
// Writes are not logged one by one: whatever lies past `synced_size` (written
// by `IoOp`s or by `File::WriteAt` alike) is what a power loss drops.
struct TrackedFile {
  std::string path;  // "" once its entry is gone
  uint64_t synced_size = 0;
};

// What a kReplace rename replaced, so that undoing the rename restores it.
struct Replaced {
  enum class Kind : uint8_t { kNothing, kFile, kDir, kLost } kind = Kind::kNothing;
  std::string bytes;  // kFile: its contents
};

// What stands at `path` of `base` now, to be put back if a rename over it is
// undone: a file of at most 1 MiB (read whole), a directory (recreated
// empty), or something lost.
Replaced SaveReplaced(FileSystem& base, const std::string& path);

// `DurabilityLog` remembers what has not been made durable yet: entries
// created and renamed in directories not synced since, and the synced size of
// every file opened for writing. Paths are kept current: a rename moves every
// path under its source. Not thread-safe (the owner locks).
class DurabilityLog {
 public:
  explicit DurabilityLog(std::shared_ptr<FileSystem> base) : base_(std::move(base)) {}

  // `path` was opened for writing; `size` is its durable size if it existed
  // and was neither created nor truncated.
  std::shared_ptr<TrackedFile> FileOpened(const std::string& path, bool created, bool truncated,
                                          uint64_t size);
  void FileSynced(TrackedFile& file, uint64_t size) { file.synced_size = size; }
  // A directory, or a file not opened for writing, was created.
  void Created(const std::string& path);
  // Removal is taken as durable at once: nothing under `path` is undone.
  void Removed(const std::string& path);
  void Renamed(const std::string& from, const std::string& to, Replaced replaced);
  // `a` and `b` swapped places: paths under each now live under the other.
  void Exchanged(const std::string& a, const std::string& b);
  void DirSynced(const std::string& path);

  // Undoes what is not durable in the base file system, then forgets it all.
  // Returns the first error; still undoes what it can.
  absl::Status DropUnsynced();

 private:
  struct Entry {
    enum class Kind : uint8_t { kCreate, kRename, kExchange } kind = Kind::kCreate;
    std::string path;                  // the created entry, the rename's target, or one exchanged
    std::string from;                  // the rename's source, or the other one exchanged
    std::string shadow;                // where paths under the replaced target went
    std::vector<std::string> pending;  // directories whose SyncDir it awaits
    Replaced replaced;
  };

  void AddEntry(Entry::Kind kind, std::string path, std::string from, Replaced replaced);
  // Moves everything under `from` to `to`: the first `end` entries and every
  // tracked file.
  void RekeyAll(absl::string_view from, absl::string_view to, size_t end);
  // Swaps the paths under `a` with those under `b`, as `RekeyAll` does.
  void SwapAll(const std::string& a, const std::string& b, size_t end);
  void ForgetFiles(const std::string& path);
  absl::Status RemoveTree(const std::string& path);
  absl::Status WriteFile(const std::string& path, const std::string& bytes);
  absl::Status TruncateTo(const std::string& path, uint64_t size);

  const std::shared_ptr<FileSystem> base_;
  std::vector<Entry> entries_;
  std::vector<std::shared_ptr<TrackedFile>> files_;
  uint64_t next_id_ = 1;
};

}  // namespace ckpt::testing::fault_internal

#endif  // CKPT_TESTING_FAULT_INJECTION_LOG_H_
