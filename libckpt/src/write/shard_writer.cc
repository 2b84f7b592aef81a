#include "write/shard_writer.h"

#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "format/manifest.h"
#include "format/names.h"
#include "io/io_executor.h"
#include "util/hash.h"
#include "util/status_macros.h"

namespace ckpt::internal {
namespace {

// Bytes copied between hash updates: small enough to stay in L2.
constexpr size_t kCopyPiece = 256 * 1024;

// Fills chunks sequentially and writes each full one at its file offset.
class ChunkStream {
 public:
  ChunkStream(IoExecutor& io, ChunkPool& pool) : io_(io), pool_(pool) {
    free_.reserve(pool.count());
    for (size_t i = pool.count(); i > 0; --i) free_.push_back(i - 1);
  }

  // Starts a new file at offset 0. REQUIRES: the previous file was flushed.
  void BeginFile(File* file) {
    file_ = file;
    file_offset_ = 0;
  }

  // Appends `n` bytes of `src` (zeros when `src` is null), hashing copied
  // bytes into `hash` when it is not null.
  absl::Status Append(const char* src, size_t n, Xxh3Stream* hash) {
    while (n > 0) {
      if (current_ == kNone) CKPT_RETURN_IF_ERROR(TakeChunk());
      size_t room = pool_.chunk_bytes() - fill_;
      size_t take = std::min({n, room, kCopyPiece});
      char* dst = pool_.chunk(current_) + fill_;
      if (src != nullptr) {
        std::memcpy(dst, src, take);
        if (hash != nullptr) hash->Update(dst, take);
        src += take;
      } else {
        std::memset(dst, 0, take);
      }
      fill_ += take;
      n -= take;
      if (fill_ == pool_.chunk_bytes()) CKPT_RETURN_IF_ERROR(Flush());
    }
    return absl::OkStatus();
  }

  // Writes the partly filled chunk, if any. REQUIRES: `fill_` is a multiple
  // of the alignment (records are padded).
  absl::Status Flush() {
    if (current_ == kNone) return absl::OkStatus();
    size_t chunk = current_;
    size_t n = fill_;
    current_ = kNone;
    fill_ = 0;
    absl::Status s = io_.Start(IoOp::Kind::kWrite, file_, file_offset_, pool_.chunk(chunk), n,
                               chunk, pool_.buf_index(chunk));
    file_offset_ += n;
    return s;
  }

 private:
  static constexpr size_t kNone = ~size_t{0};

  absl::Status TakeChunk() {
    while (free_.empty()) {
      std::vector<uint64_t> done;
      CKPT_RETURN_IF_ERROR(io_.Poll(/*block=*/true, &done));
      for (uint64_t tag : done) free_.push_back(tag);
    }
    current_ = free_.back();
    free_.pop_back();
    return absl::OkStatus();
  }

  IoExecutor& io_;
  ChunkPool& pool_;
  std::vector<size_t> free_;
  size_t current_ = kNone;
  size_t fill_ = 0;
  File* file_ = nullptr;
  uint64_t file_offset_ = 0;
};

}  // namespace

absl::Status WriteShards(FileSystem& fs, IoQueue& queue, bool direct, ChunkPool& pool,
                         const std::string& dir, std::span<const TensorView> tensors,
                         std::span<const PlannedShard> plan, std::vector<uint64_t>* hashes) {
  hashes->assign(tensors.size(), 0);
  std::vector<std::unique_ptr<File>> files;
  files.reserve(plan.size());
  OpenOptions open;
  open.write = true;
  open.create = true;
  open.exclusive = true;
  open.direct = direct;
  absl::Status status;
  {
    IoExecutor io(&queue, pool.chunk_bytes());
    ChunkStream stream(io, pool);
    Xxh3Stream hash;
    for (const PlannedShard& shard : plan) {
      auto file = fs.Open(JoinPath(dir, shard.file), open);
      if (!file.ok()) {
        status = file.status();
        break;
      }
      files.push_back(std::move(*file));
      stream.BeginFile(files.back().get());
      uint64_t position = 0;
      for (const PlannedRecord& record : shard.records) {
        const TensorView& t = tensors[record.tensor];
        status = stream.Append(nullptr, record.offset - position, nullptr);  // padding
        if (!status.ok()) break;
        hash.Reset();
        status = stream.Append(static_cast<const char*>(t.data), t.nbytes, &hash);
        if (!status.ok()) break;
        (*hashes)[record.tensor] = hash.Digest();
        position = record.offset + t.nbytes;
      }
      if (status.ok()) status = stream.Append(nullptr, shard.padded_bytes - position, nullptr);
      if (status.ok()) status = stream.Flush();
      if (!status.ok()) break;
    }
    absl::Status drained = io.Drain();
    if (status.ok()) status = drained;
  }
  for (size_t i = 0; i < files.size() && status.ok(); ++i) {
    if (plan[i].file_bytes != plan[i].padded_bytes) status = files[i]->Truncate(plan[i].file_bytes);
    if (status.ok()) status = files[i]->Sync();
    if (status.ok()) status = files[i]->Close();
  }
  return status;
}

}  // namespace ckpt::internal
