// `ShardFiles`: the shard files a reader has opened, and the I/O queue it
// reads them through.
#ifndef CKPT_READ_SHARD_FILES_H_
#define CKPT_READ_SHARD_FILES_H_

#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "ckpt/file_system.h"
#include "ckpt/options.h"
#include "ckpt/tensor.h"
#include "io/backend.h"
#include "util/worker_pool.h"

namespace ckpt::internal {

class ShardFiles {
 public:
  ShardFiles(std::shared_ptr<FileSystem> fs, const IoOptions& io, OpenedIo backend)
      : fs_(std::move(fs)), io_(io), backend_(std::move(backend)) {}

  // Opens `dir`/`shard` on first use and keeps it open; later calls return
  // the same file. With O_DIRECT chosen by `DirectIoMode::kAuto`, a file
  // system that refuses it at open (kInvalidArgument) switches this and
  // every later open to buffered I/O; a forced O_DIRECT stays an error.
  absl::StatusOr<File*> Get(const std::string& dir, const std::string& shard);

  IoQueue* queue() const { return backend_.queue.get(); }
  // Every read of these files reports its length here (Reader::bytes_read).
  void CountRead(uint64_t bytes) { bytes_read_ += bytes; }
  uint64_t bytes_read() const { return bytes_read_; }
  const IoOptions& io() const { return io_; }
  // Threads that decode compressed records and deltas (created on first use).
  WorkerPool* codec_pool() {
    if (codec_pool_ == nullptr) {
      codec_pool_ = std::make_unique<WorkerPool>(WorkerPool::DefaultThreads(0), "ckpt-decode", 0);
    }
    return codec_pool_.get();
  }

 private:
  const std::shared_ptr<FileSystem> fs_;
  const IoOptions io_;
  OpenedIo backend_;                                    // `direct` may turn off
  std::map<std::string, std::unique_ptr<File>> files_;  // by path; closed before the queue
  uint64_t bytes_read_ = 0;
  std::unique_ptr<WorkerPool> codec_pool_;
};

}  // namespace ckpt::internal

#endif  // CKPT_READ_SHARD_FILES_H_
