#include "ckpt/reader.h"

#include <algorithm>
#include <cstring>
#include <map>

#include <zstd.h>

#include "absl/strings/str_cat.h"
#include "ckpt/catalog.h"
#include "format/manifest.h"
#include "delta/delta_codec.h"
#include "format/names.h"
#include "io/backend.h"
#include "io/chunk_pool.h"
#include "io/io_executor.h"
#include "read/load_manifest.h"
#include "util/hash.h"
#include "util/log.h"
#include "util/status_macros.h"

namespace ckpt {
namespace {

using namespace internal;  // NOLINT: the reader is glue over the internals

constexpr uint64_t kAlign = kDirectIoAlignment;
uint64_t AlignDown(uint64_t n) { return n / kAlign * kAlign; }
uint64_t AlignUp(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
bool IsAligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kAlign == 0; }

absl::Status ChecksumMismatch(const std::string& dir, const TensorInfo& t, uint64_t actual) {
  return absl::DataLossError(absl::StrCat(
      "tensor \"", t.name, "\" in shard ", JoinPath(dir, t.shard), " at offset ", t.offset,
      ": checksum mismatch (manifest ", HashToHex(t.xxh3), ", data ", HashToHex(actual), ")"));
}

// One checkpoint of a delta chain.
struct Link {
  std::string dir;
  Manifest manifest;
  std::map<std::string, size_t> index;
};

class ReaderImpl final : public Reader {
 public:
  // `chain` runs from a full checkpoint to the one opened (a single link
  // for a full checkpoint).
  ReaderImpl(std::shared_ptr<FileSystem> fs, IoOptions io, std::vector<Link> chain,
             internal::IoBackend backend)
      : fs_(std::move(fs)),
        io_(io),
        chain_(std::move(chain)),
        dir_(chain_.back().dir),
        manifest_(chain_.back().manifest),
        backend_(std::move(backend)) {
    for (Link& link : chain_) {
      for (size_t i = 0; i < link.manifest.tensors.size(); ++i) {
        link.index[link.manifest.tensors[i].name] = i;
      }
    }
  }

  int64_t step() const override { return manifest_.step; }
  bool is_delta() const { return chain_.size() > 1; }
  const std::string& dir() const override { return dir_; }
  const std::string& extras_json() const override { return manifest_.extras_json; }
  const std::vector<TensorInfo>& tensors() const override { return manifest_.tensors; }
  const TensorInfo* Find(absl::string_view name) const override {
    return FindIn(chain_.size() - 1, name);
  }
  const TensorInfo* FindIn(size_t link, absl::string_view name) const {
    const Link& l = chain_[link];
    auto it = l.index.find(std::string(name));
    return it == l.index.end() ? nullptr : &l.manifest.tensors[it->second];
  }

  absl::Status ReadInto(std::span<const ReadTarget> targets) override;
  absl::StatusOr<Tensor> Read(absl::string_view name) override;
  absl::StatusOr<std::vector<Tensor>> ReadAll() override;
  absl::Status Verify() override;

 private:
  // One transfer of a `ReadInto`: either straight into the caller's memory,
  // or into a pool chunk that is then copied there.
  struct Part {
    size_t job = 0;
    char* dst = nullptr;      // where the bytes finally go
    size_t copy_bytes = 0;    // bytes to copy from `chunk` (0: read in place)
    size_t chunk = SIZE_MAX;  // pool chunk used, if any
  };
  struct Job {
    const TensorInfo* info = nullptr;  // the record read (in link `link`)
    char* dst = nullptr;
    size_t parts_left = 0;
    size_t link = 0;
  };

  absl::StatusOr<File*> GetFile(const std::string& dir, const std::string& shard);
  // Reads and decompresses a zstd record into `dst` (or, when null, only
  // checks it), verifying the XXH3 of the decompressed bytes.
  absl::Status ReadCompressed(const std::string& dir, const TensorInfo& t, char* dst);
  // Reads a record's stored bytes (a delta payload) into memory.
  absl::StatusOr<AlignedBytes> ReadStored(const std::string& dir, const TensorInfo& t);
  // The newest link at or before the opened one that stores `name` whole.
  absl::StatusOr<size_t> BaseLinkOf(absl::string_view name) const;
  // Applies the deltas of `name` after link `base` to `dst`, checking the
  // checksum after each.
  absl::Status ApplyDeltas(absl::string_view name, size_t base, char* dst);
  absl::Status VerifyByReading();
  absl::Status EnsurePool();
  absl::Status TakeChunk(IoExecutor& io, size_t* chunk);
  absl::Status Complete(uint64_t part_tag);
  absl::Status FinishJob(Job& job);

  const std::shared_ptr<FileSystem> fs_;
  const IoOptions io_;
  std::vector<Link> chain_;
  const std::string& dir_;
  const Manifest& manifest_;
  internal::IoBackend backend_;
  std::map<std::string, std::unique_ptr<File>> files_;  // by path
  std::optional<ChunkPool> pool_;
  std::vector<size_t> free_chunks_;
  std::vector<Part> parts_;
  std::vector<Job> jobs_;
};

absl::StatusOr<File*> ReaderImpl::GetFile(const std::string& dir, const std::string& shard) {
  const std::string path = JoinPath(dir, shard);
  auto it = files_.find(path);
  if (it != files_.end()) return it->second.get();
  OpenOptions options;
  options.direct = backend_.direct;
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

absl::Status ReaderImpl::EnsurePool() {
  if (pool_.has_value()) return absl::OkStatus();
  // No more than the checkpoint could use: small checkpoints open fast.
  uint64_t largest = 0;
  for (const TensorInfo& t : manifest_.tensors) largest = std::max(largest, t.raw_bytes);
  // At most 8 chunks: aligned targets only pass record tails through them,
  // and pre-faulting more would cost the first read more than it saves.
  const uint64_t wanted = std::max<uint64_t>(
      2 * io_.chunk_bytes,
      std::min({static_cast<uint64_t>(io_.buffer_bytes), AlignUp(largest) * 2,
                static_cast<uint64_t>(8 * io_.chunk_bytes)}));
  CKPT_ASSIGN_OR_RETURN(ChunkPool pool, ChunkPool::Create(io_.chunk_bytes, wanted,
                                                          backend_.queue.get()));
  pool_.emplace(std::move(pool));
  for (size_t i = pool_->count(); i > 0; --i) free_chunks_.push_back(i - 1);
  return absl::OkStatus();
}

absl::Status ReaderImpl::TakeChunk(IoExecutor& io, size_t* chunk) {
  CKPT_RETURN_IF_ERROR(EnsurePool());
  while (free_chunks_.empty()) {
    std::vector<uint64_t> done;
    CKPT_RETURN_IF_ERROR(io.Poll(/*block=*/true, &done));
    for (uint64_t tag : done) CKPT_RETURN_IF_ERROR(Complete(tag));
  }
  *chunk = free_chunks_.back();
  free_chunks_.pop_back();
  return absl::OkStatus();
}

absl::Status ReaderImpl::FinishJob(Job& job) {
  const uint64_t actual = Xxh3(job.dst, job.info->raw_bytes);
  if (actual != job.info->xxh3) return ChecksumMismatch(chain_[job.link].dir, *job.info, actual);
  return absl::OkStatus();
}

absl::Status ReaderImpl::Complete(uint64_t part_tag) {
  Part& part = parts_[part_tag];
  if (part.chunk != SIZE_MAX) {
    std::memcpy(part.dst, pool_->chunk(part.chunk), part.copy_bytes);
    free_chunks_.push_back(part.chunk);
    part.chunk = SIZE_MAX;
  }
  Job& job = jobs_[part.job];
  if (--job.parts_left == 0) return FinishJob(job);
  return absl::OkStatus();
}

absl::StatusOr<AlignedBytes> ReaderImpl::ReadStored(const std::string& dir, const TensorInfo& t) {
  CKPT_ASSIGN_OR_RETURN(File * file, GetFile(dir, t.shard));
  const uint64_t length = file->direct() ? AlignUp(t.stored_bytes) : t.stored_bytes;
  CKPT_ASSIGN_OR_RETURN(AlignedBytes stored, AlignedBytes::Allocate(length, false));
  IoExecutor io(backend_.queue.get(), io_.chunk_bytes);
  CKPT_RETURN_IF_ERROR(io.Start(IoOp::Kind::kRead, file, t.offset, stored.data(), length, 0, -1,
                                t.stored_bytes));
  CKPT_RETURN_IF_ERROR(io.Drain());
  return stored;
}

absl::StatusOr<size_t> ReaderImpl::BaseLinkOf(absl::string_view name) const {
  for (size_t l = chain_.size(); l > 0; --l) {
    const TensorInfo* t = FindIn(l - 1, name);
    if (t == nullptr) break;
    if (!IsDeltaEncoding(t->encoding)) return l - 1;
  }
  return absl::DataLossError(absl::StrCat("tensor \"", name, "\" of ", dir_,
                                          " has no whole record in its delta chain"));
}

absl::Status ReaderImpl::ApplyDeltas(absl::string_view name, size_t base, char* dst) {
  const TensorInfo* first = FindIn(base, name);
  for (size_t l = base + 1; l < chain_.size(); ++l) {
    const TensorInfo* t = FindIn(l, name);
    if (t == nullptr || t->dtype != first->dtype || t->shape != first->shape) {
      return absl::DataLossError(absl::StrCat("tensor \"", name, "\" changes dtype or shape along the delta chain of ", dir_));
    }
    CKPT_ASSIGN_OR_RETURN(AlignedBytes stored, ReadStored(chain_[l].dir, *t));
    absl::Status applied = ApplyDelta(t->encoding, static_cast<const char*>(stored.data()),
                                      t->stored_bytes, dst, t->raw_bytes, t->dtype);
    if (!applied.ok()) {
      return absl::DataLossError(absl::StrCat("tensor \"", name, "\" in shard ",
                                              JoinPath(chain_[l].dir, t->shard), " at offset ",
                                              t->offset, ": ", applied.message()));
    }
    const uint64_t actual = Xxh3(dst, t->raw_bytes);
    if (actual != t->xxh3) return ChecksumMismatch(chain_[l].dir, *t, actual);
  }
  return absl::OkStatus();
}

absl::Status ReaderImpl::ReadCompressed(const std::string& dir, const TensorInfo& t, char* dst) {
  CKPT_ASSIGN_OR_RETURN(AlignedBytes stored, ReadStored(dir, t));
  const std::string where = absl::StrCat("tensor \"", t.name, "\" in shard ",
                                         JoinPath(dir, t.shard), " at offset ", t.offset);
  std::unique_ptr<ZSTD_DCtx, size_t (*)(ZSTD_DCtx*)> dctx(ZSTD_createDCtx(), ZSTD_freeDCtx);
  if (dctx == nullptr) return absl::ResourceExhaustedError("ZSTD_createDCtx failed");
  std::vector<char> scratch(dst == nullptr ? std::min<uint64_t>(t.raw_bytes, 1 << 20) : 0);
  Xxh3Stream hash;
  ZSTD_inBuffer in{stored.data(), t.stored_bytes, 0};
  uint64_t produced = 0;
  size_t last = 0;
  while (in.pos < in.size) {
    char* out_base = dst != nullptr ? dst + produced : scratch.data();
    const size_t room = dst != nullptr ? t.raw_bytes - produced
                                       : std::min<uint64_t>(scratch.size(), t.raw_bytes - produced);
    if (room == 0) return absl::DataLossError(absl::StrCat(where, ": decompresses to more than ", t.raw_bytes, " bytes"));
    ZSTD_outBuffer out{out_base, room, 0};
    last = ZSTD_decompressStream(dctx.get(), &out, &in);
    if (ZSTD_isError(last)) {
      return absl::DataLossError(absl::StrCat(where, ": corrupt zstd data: ", ZSTD_getErrorName(last)));
    }
    hash.Update(out_base, out.pos);
    produced += out.pos;
  }
  if (last != 0 || produced != t.raw_bytes) {
    return absl::DataLossError(absl::StrCat(where, ": zstd data ends after ", produced, " of ",
                                            t.raw_bytes, " bytes"));
  }
  if (hash.Digest() != t.xxh3) return ChecksumMismatch(dir, t, hash.Digest());
  return absl::OkStatus();
}

absl::Status ReaderImpl::ReadInto(std::span<const ReadTarget> targets) {
  jobs_.clear();
  parts_.clear();
  jobs_.reserve(targets.size());
  for (const ReadTarget& target : targets) {
    const TensorInfo* info = Find(target.name);
    if (info == nullptr) {
      return absl::NotFoundError(absl::StrCat("no tensor \"", target.name, "\" in ", dir_));
    }
    if (target.capacity < info->raw_bytes || (info->raw_bytes > 0 && target.data == nullptr)) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", target.name, "\" needs ",
                                                     info->raw_bytes, " bytes, target has ",
                                                     target.capacity));
    }
    // A delta is applied to the newest whole record of its chain.
    CKPT_ASSIGN_OR_RETURN(size_t base, BaseLinkOf(target.name));
    jobs_.push_back(Job{FindIn(base, target.name), static_cast<char*>(target.data), 0, base});
  }
  absl::Status status;
  // Compressed records first, each on its own (one executor per queue at a time).
  for (const Job& job : jobs_) {
    if (job.info->encoding == "zstd") {
      CKPT_RETURN_IF_ERROR(ReadCompressed(chain_[job.link].dir, *job.info, job.dst));
    }
  }
  {
    IoExecutor io(backend_.queue.get(), io_.chunk_bytes);
    auto poll = [&](bool block) -> absl::Status {
      std::vector<uint64_t> done;
      absl::Status s = io.Poll(block, &done);
      for (uint64_t tag : done) {
        absl::Status c = Complete(tag);
        if (s.ok()) s = c;
      }
      return s;
    };
    for (size_t j = 0; j < jobs_.size() && status.ok(); ++j) {
      Job& job = jobs_[j];
      const TensorInfo& t = *job.info;
      auto file = GetFile(chain_[job.link].dir, t.shard);
      if (!file.ok()) {
        status = file.status();
        break;
      }
      if (t.encoding == "zstd") continue;  // read before this loop
      if (t.raw_bytes == 0) {
        status = FinishJob(job);
        continue;
      }
      job.parts_left = 1;  // held until every part is started
      auto add_part = [&](Part part, uint64_t offset, void* buf, size_t length, size_t required,
                          int buf_index) {
        parts_.push_back(part);
        ++job.parts_left;
        return io.Start(IoOp::Kind::kRead, *file, offset, buf, length, parts_.size() - 1,
                        buf_index, required);
      };
      if (!(*file)->direct()) {
        status = add_part(Part{j, job.dst}, t.offset, job.dst, t.raw_bytes, t.raw_bytes, -1);
      } else if (IsAligned(job.dst)) {
        // Whole blocks straight into place; the final partial block through a chunk.
        const uint64_t body = AlignDown(t.raw_bytes);
        if (body > 0) status = add_part(Part{j, job.dst}, t.offset, job.dst, body, body, -1);
        const uint64_t tail = t.raw_bytes - body;
        size_t chunk = 0;
        if (status.ok() && tail > 0) status = TakeChunk(io, &chunk);
        if (status.ok() && tail > 0) {
          status = add_part(Part{j, job.dst + body, tail, chunk}, t.offset + body,
                            pool_->chunk(chunk), kAlign, tail, pool_->buf_index(chunk));
        }
      } else {
        for (uint64_t done = 0; done < t.raw_bytes && status.ok();) {
          const uint64_t n = std::min<uint64_t>(io_.chunk_bytes, t.raw_bytes - done);
          size_t chunk = 0;
          status = TakeChunk(io, &chunk);
          if (status.ok()) {
            status = add_part(Part{j, job.dst + done, n, chunk}, t.offset + done,
                              pool_->chunk(chunk), AlignUp(n), n, pool_->buf_index(chunk));
          }
          done += n;
        }
      }
      if (status.ok() && --job.parts_left == 0) status = FinishJob(job);
      if (status.ok()) status = poll(/*block=*/false);
    }
    while (status.ok() && io.transfers_in_flight() > 0) status = poll(/*block=*/true);
    std::vector<uint64_t> rest;
    absl::Status drained = io.Drain(&rest);
    if (status.ok()) status = drained;
    for (uint64_t tag : rest) {
      absl::Status c = Complete(tag);
      if (status.ok()) status = c;
    }
  }
  // Return every chunk, including those of abandoned parts.
  if (pool_.has_value()) {
    free_chunks_.clear();
    for (size_t i = pool_->count(); i > 0; --i) free_chunks_.push_back(i - 1);
  }
  // Then the deltas, link by link, each checked.
  for (size_t j = 0; j < jobs_.size() && status.ok(); ++j) {
    if (jobs_[j].link + 1 < chain_.size()) {
      status = ApplyDeltas(jobs_[j].info->name, jobs_[j].link, jobs_[j].dst);
    }
  }
  return status;
}

absl::StatusOr<Tensor> ReaderImpl::Read(absl::string_view name) {
  const TensorInfo* info = Find(name);
  if (info == nullptr) return absl::NotFoundError(absl::StrCat("no tensor \"", name, "\" in ", dir_));
  Tensor tensor{info->name, info->dtype, info->shape, {}};
  CKPT_ASSIGN_OR_RETURN(tensor.bytes, AlignedBytes::Allocate(info->raw_bytes, false));
  ReadTarget target{info->name, tensor.bytes.data(), tensor.bytes.size()};
  CKPT_RETURN_IF_ERROR(ReadInto({&target, 1}));
  return tensor;
}

absl::StatusOr<std::vector<Tensor>> ReaderImpl::ReadAll() {
  std::vector<Tensor> tensors;
  std::vector<ReadTarget> targets;
  tensors.reserve(manifest_.tensors.size());
  for (const TensorInfo& info : manifest_.tensors) {
    Tensor tensor{info.name, info.dtype, info.shape, {}};
    CKPT_ASSIGN_OR_RETURN(tensor.bytes, AlignedBytes::Allocate(info.raw_bytes, false));
    targets.push_back(ReadTarget{info.name, tensor.bytes.data(), tensor.bytes.size()});
    tensors.push_back(std::move(tensor));
  }
  CKPT_RETURN_IF_ERROR(ReadInto(targets));
  return tensors;
}

absl::Status ReaderImpl::VerifyByReading() {
  // Reconstructs each tensor through the chain, checking every link.
  uint64_t largest = 0;
  for (const TensorInfo& t : manifest_.tensors) largest = std::max(largest, t.raw_bytes);
  CKPT_ASSIGN_OR_RETURN(AlignedBytes buffer, AlignedBytes::Allocate(largest, false));
  for (const TensorInfo& t : manifest_.tensors) {
    ReadTarget target{t.name, buffer.data(), buffer.size()};
    CKPT_RETURN_IF_ERROR(ReadInto({&target, 1}));
  }
  return absl::OkStatus();
}

absl::Status ReaderImpl::Verify() {
  if (is_delta()) return VerifyByReading();
  CKPT_RETURN_IF_ERROR(EnsurePool());
  for (const TensorInfo& t : manifest_.tensors) {
    if (t.encoding == "zstd") CKPT_RETURN_IF_ERROR(ReadCompressed(dir_, t, nullptr));
  }
  // Pieces are consumed strictly in order (the hash is streamed), while up to
  // a pool's worth of them is in flight.
  struct Piece {
    size_t tensor;
    uint64_t start;  // within the record
    size_t bytes;
    size_t chunk;
    bool done;
  };
  std::vector<Piece> ring;  // window of started pieces, oldest first
  size_t head = 0;
  Xxh3Stream hash;
  absl::Status status;
  IoExecutor io(backend_.queue.get(), io_.chunk_bytes);
  std::vector<uint64_t> done_tags;
  size_t next_tensor = 0;
  uint64_t next_start = 0;
  free_chunks_.clear();
  for (size_t i = pool_->count(); i > 0; --i) free_chunks_.push_back(i - 1);
  std::map<size_t, size_t> chunk_to_piece;
  auto consume = [&]() -> absl::Status {
    while (head < ring.size() && ring[head].done) {
      Piece& p = ring[head];
      const TensorInfo& t = manifest_.tensors[p.tensor];
      if (p.start == 0) hash.Reset();
      hash.Update(pool_->chunk(p.chunk), p.bytes);
      free_chunks_.push_back(p.chunk);
      if (p.start + p.bytes == t.raw_bytes && hash.Digest() != t.xxh3) {
        return ChecksumMismatch(dir_, t, hash.Digest());  // full checkpoint: one link
      }
      ++head;
    }
    return absl::OkStatus();
  };
  while (status.ok()) {
    // Empty and compressed tensors are checked on their own (compressed
    // ones before this loop).
    while (status.ok() && next_tensor < manifest_.tensors.size() &&
           (manifest_.tensors[next_tensor].raw_bytes == 0 ||
            manifest_.tensors[next_tensor].encoding == "zstd")) {
      const TensorInfo& t = manifest_.tensors[next_tensor];
      if (t.encoding != "zstd" && Xxh3(nullptr, 0) != t.xxh3) {
        status = ChecksumMismatch(dir_, t, Xxh3(nullptr, 0));
      }
      ++next_tensor;
    }
    if (!status.ok()) break;
    const bool more = next_tensor < manifest_.tensors.size();
    if (more && !free_chunks_.empty()) {
      const TensorInfo& t = manifest_.tensors[next_tensor];
      auto file = GetFile(dir_, t.shard);
      if (!file.ok()) {
        status = file.status();
        break;
      }
      const size_t n = std::min<uint64_t>(io_.chunk_bytes, t.raw_bytes - next_start);
      const size_t chunk = free_chunks_.back();
      free_chunks_.pop_back();
      ring.push_back(Piece{next_tensor, next_start, n, chunk, false});
      chunk_to_piece[chunk] = ring.size() - 1;
      const size_t length = (*file)->direct() ? AlignUp(n) : n;
      status = io.Start(IoOp::Kind::kRead, *file, t.offset + next_start, pool_->chunk(chunk),
                        length, chunk, pool_->buf_index(chunk), n);
      next_start += n;
      if (next_start == t.raw_bytes) {
        ++next_tensor;
        next_start = 0;
      }
      continue;
    }
    if (!more && head == ring.size()) break;
    done_tags.clear();
    status = io.Poll(/*block=*/true, &done_tags);
    for (uint64_t chunk : done_tags) ring[chunk_to_piece[chunk]].done = true;
    if (status.ok()) status = consume();
  }
  absl::Status drained = io.Drain();
  free_chunks_.clear();
  for (size_t i = pool_->count(); i > 0; --i) free_chunks_.push_back(i - 1);
  return status.ok() ? drained : status;
}

}  // namespace

namespace {

constexpr size_t kMaxChainLength = 100000;

// Loads checkpoint `step` and, for a delta, every base down to a full
// checkpoint, checking each base against the checksum its dependant recorded.
absl::StatusOr<std::vector<Link>> LoadChain(FileSystem& fs, IoQueue& queue, const std::string& root,
                                            int64_t step) {
  std::vector<Link> chain;
  int64_t next = step;
  uint64_t expected_hash = 0;
  bool check_hash = false;
  while (true) {
    const std::string dir = JoinPath(root, CheckpointDirName(next));
    auto manifest = LoadManifest(fs, queue, dir, next);
    if (!manifest.ok()) {
      if (!chain.empty() && (manifest.status().code() == absl::StatusCode::kDataLoss ||
                             !fs.Stat(dir).ok())) {
        return absl::DataLossError(absl::StrCat("base checkpoint step ", next, " of delta step ",
                                                chain.back().manifest.step, " is missing or damaged: ",
                                                manifest.status().message()));
      }
      return manifest.status();
    }
    // A base rewritten by compaction still matches: it names the checksum
    // of the delta it replaced (its values are the same).
    if (check_hash && !manifest->MatchesBaseHash(expected_hash)) {
      return absl::DataLossError(absl::StrCat(
          "base checkpoint step ", next, " of delta step ", chain.back().manifest.step,
          " is not the one the delta was written against (manifest checksum ",
          HashToHex(manifest->manifest_xxh3), ", expected ", HashToHex(expected_hash), ")"));
    }
    const bool delta = manifest->kind == "delta";
    const int64_t base = manifest->base_step;
    expected_hash = manifest->base_manifest_xxh3;
    chain.push_back(Link{dir, std::move(*manifest), {}});
    if (!delta) break;
    if (chain.size() >= kMaxChainLength) {
      return absl::DataLossError(absl::StrCat("delta chain of step ", step, " is too long"));
    }
    next = base;
    check_hash = true;
  }
  std::reverse(chain.begin(), chain.end());
  return chain;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Reader>> Reader::Open(const std::string& root,
                                                     const ReaderOptions& options) {
  std::shared_ptr<FileSystem> fs = options.fs != nullptr ? options.fs : PosixFileSystem();
  CKPT_ASSIGN_OR_RETURN(std::vector<int64_t> steps, ListSteps(root, fs));
  auto opened = OpenIoBackend(*fs, options.io, "");
  if (!opened.ok()) return Annotate(opened.status(), absl::StrCat("checkpoint root ", root));
  internal::IoBackend backend = std::move(*opened);
  if (options.step.has_value()) {
    const int64_t step = *options.step;
    if (!std::binary_search(steps.begin(), steps.end(), step)) {
      return absl::NotFoundError(absl::StrCat("no checkpoint for step ", step, " in ", root));
    }
    CKPT_ASSIGN_OR_RETURN(std::vector<Link> chain, LoadChain(*fs, *backend.queue, root, step));
    return std::unique_ptr<Reader>(
        new ReaderImpl(fs, options.io, std::move(chain), std::move(backend)));
  }
  std::string skipped;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    auto chain = LoadChain(*fs, *backend.queue, root, *it);
    if (chain.ok()) {
      return std::unique_ptr<Reader>(
          new ReaderImpl(fs, options.io, std::move(*chain), std::move(backend)));
    }
    // Only damage is skipped: an I/O error (EIO, EACCES, ...) may be
    // transient, and silently restoring an older step would hide it.
    if (chain.status().code() != absl::StatusCode::kDataLoss &&
        chain.status().code() != absl::StatusCode::kUnimplemented) {
      return Annotate(chain.status(), absl::StrCat("checkpoint step ", *it, " in ", root));
    }
    Log(LogLevel::kWarning, absl::StrCat("skipping step ", *it, ": ", chain.status().message()));
    absl::StrAppend(&skipped, skipped.empty() ? "" : "; ", "step ", *it, ": ",
                    chain.status().message());
  }
  if (skipped.empty()) return absl::NotFoundError(absl::StrCat("no checkpoint in ", root));
  return absl::DataLossError(absl::StrCat("no readable checkpoint in ", root, " (", skipped, ")"));
}

}  // namespace ckpt
