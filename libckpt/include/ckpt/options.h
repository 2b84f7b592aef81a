// ckpt/options.h: knobs of the engine and the reader.
#ifndef CKPT_OPTIONS_H_
#define CKPT_OPTIONS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>

#include "ckpt/file_system.h"

namespace ckpt {

// How data reaches the disk. `kAuto` probes and logs what it chose.
enum class IoBackend : uint8_t {
  kAuto,     // io_uring if the kernel allows it, else kThreads
  kUring,    // io_uring; opening fails if it is refused
  kThreads,  // a thread pool calling pwrite/pread
};

// Whether shard files bypass the page cache.
enum class DirectIoMode : uint8_t {
  kAuto,  // O_DIRECT where the file system accepts it (probed per root)
  kOn,    // O_DIRECT; opening fails where it is refused
  kOff,   // buffered I/O
};

struct IoOptions {
  IoBackend backend = IoBackend::kAuto;
  DirectIoMode direct = DirectIoMode::kAuto;
  // Transfers in flight at once, across all shard files.
  size_t queue_depth = 32;
  // Size of one transfer; a multiple of 4 KiB.
  size_t chunk_bytes = size_t{1} << 20;
  // Host memory, allocated and pre-faulted once per engine or reader, that
  // bytes pass through on their way to or from disk. A multiple of
  // `chunk_bytes`; at least 2 chunks.
  size_t buffer_bytes = size_t{64} << 20;
};

struct EngineOptions {
  // Every file-system call goes through `fs`; null means `PosixFileSystem()`.
  std::shared_ptr<FileSystem> fs;
  IoOptions io;
  // Tensors are grouped into shard files by module (the name up to its last
  // '.' or '/'). Consecutive modules are merged into one shard until it holds
  // at least `shard_min_bytes`; a module larger than `shard_max_bytes` is
  // split (at tensor boundaries) into several shards.
  uint64_t shard_min_bytes = uint64_t{16} << 20;
  uint64_t shard_max_bytes = uint64_t{256} << 20;
  // Create the root directory (not its parents) when it does not exist.
  bool create_root = true;
};

struct ReaderOptions {
  std::shared_ptr<FileSystem> fs;  // null means `PosixFileSystem()`
  IoOptions io;
  // The step to open; unset opens the newest committed checkpoint whose
  // manifest verifies.
  std::optional<int64_t> step;
};

}  // namespace ckpt

#endif  // CKPT_OPTIONS_H_
