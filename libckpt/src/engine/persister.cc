#include "engine/persister.h"

#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "commit/commit.h"
#include "format/manifest.h"
#include "format/names.h"
#include "io/io_executor.h"
#include "io/small_file.h"
#include "util/mutex.h"
#include "util/status_macros.h"

namespace ckpt::internal {

Persister::Persister(PersisterContext context, std::function<void(SaveJob&)> on_done)
    : ctx_(std::move(context)), on_done_(std::move(on_done)), thread_([this] { Run(); }) {}

Persister::~Persister() {
  if (thread_.joinable()) Stop(/*abandon=*/false);
}

void Persister::Enqueue(std::shared_ptr<SaveJob> job) {
  MutexLock lock(&mu_);
  jobs_.push_back(std::move(job));
}

void Persister::Stop(bool abandon) {
  {
    MutexLock lock(&mu_);
    if (abandon) {
      abandon_ = true;
      for (auto& job : jobs_) job->abort = true;
    }
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void Persister::Run() {
  while (true) {
    std::shared_ptr<SaveJob> job;
    {
      MutexLock lock(&mu_);
      mu_.Await([this] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      job = jobs_.front();
    }
    Persist(*job);
    {
      MutexLock lock(&mu_);
      jobs_.pop_front();
    }
    on_done_(*job);
  }
}

namespace {

// Tags of compressed-output buffers carry this bit; staging chunks do not.
constexpr uint64_t kOutputTag = uint64_t{1} << 62;

uint64_t AlignUp(uint64_t n) { return (n + kRecordAlignment - 1) / kRecordAlignment * kRecordAlignment; }

}  // namespace

absl::Status Persister::WriteChunks(SaveJob& job, std::vector<std::unique_ptr<File>>& files,
                                    std::unique_ptr<ShardCompressor>* compressor) {
  absl::Status status;
  if (abandon_) status = absl::CancelledError("save cancelled: engine closing");
  if (status.ok()) status = ctx_.fs->CreateDir(job.temp_dir);
  OpenOptions open;
  open.write = true;
  open.create = true;
  open.exclusive = true;
  open.direct = ctx_.direct;
  for (size_t i = 0; i < job.plan.size() && status.ok(); ++i) {
    auto file = ctx_.fs->Open(JoinPath(job.temp_dir, job.plan[i].file), open);
    if (file.ok()) files.push_back(std::move(*file));
    else status = file.status();
  }
  if (status.ok() && ctx_.compression_level > 0) {
    auto c = ShardCompressor::Create(job, ctx_.compression_level, ctx_.pool->chunk_bytes(), 8);
    if (c.ok()) *compressor = std::move(*c);
    else status = c.status();
  }
  if (!status.ok()) job.abort = true;
  ShardCompressor* zstd = compressor->get();
  std::vector<size_t> free_outputs;
  if (zstd != nullptr) {
    for (size_t i = zstd->buffers(); i > 0; --i) free_outputs.push_back(i - 1);
  }

  IoExecutor io(ctx_.queue, ctx_.pool->chunk_bytes());
  std::vector<uint64_t> written;
  auto fail = [&](absl::Status s) {
    if (status.ok()) status = std::move(s);
    job.abort = true;  // the stager stops at its next chunk
  };
  // Gives back the buffers of finished writes.
  auto release = [&](const std::vector<uint64_t>& tags) {
    for (uint64_t tag : tags) {
      if (tag & kOutputTag) free_outputs.push_back(tag & ~kOutputTag);
      else ctx_.pool->Release(tag);
    }
    if (!tags.empty()) job.Touch();
  };
  auto poll = [&](bool block) {
    written.clear();
    absl::Status polled = io.Poll(block, &written);
    release(written);
    if (!polled.ok()) fail(polled);
  };
  ShardCompressor::AcquireFn acquire = [&]() -> absl::StatusOr<size_t> {
    while (free_outputs.empty() && status.ok()) poll(/*block=*/true);
    if (!status.ok()) return status;
    size_t i = free_outputs.back();
    free_outputs.pop_back();
    return i;
  };
  ShardCompressor::EmitFn emit = [&](size_t shard, uint64_t offset, size_t buffer, size_t bytes) {
    const size_t length = AlignUp(bytes);  // only the last block of a shard is partial
    if (length != bytes) std::memset(zstd->buffer(buffer) + bytes, 0, length - bytes);
    return io.Start(IoOp::Kind::kWrite, files[shard].get(), offset, zstd->buffer(buffer), length,
                    kOutputTag | buffer);
  };

  std::vector<StagedChunk> ready;
  bool more = true;
  while (more || io.transfers_in_flight() > 0) {
    ready.clear();
    if (more) more = job.TakeChunks(/*block=*/io.transfers_in_flight() == 0, &ready);
    for (const StagedChunk& c : ready) {
      if (status.ok() && abandon_) fail(absl::CancelledError("save cancelled: engine closing"));
      if (status.ok() && zstd != nullptr) {
        absl::Status s = zstd->Consume(c, ctx_.pool->chunk(c.chunk), acquire, emit);
        if (!s.ok()) fail(s);
      } else if (status.ok()) {
        absl::Status s = io.Start(IoOp::Kind::kWrite, files[c.shard].get(), c.file_offset,
                                  ctx_.pool->chunk(c.chunk), c.bytes, c.chunk,
                                  ctx_.pool->buf_index(c.chunk));
        if (s.ok()) continue;
        fail(s);
      }
      ctx_.pool->Release(c.chunk);  // compressed, or dropped by a failed save
    }
    if (!more && status.ok() && zstd != nullptr) {
      absl::Status s = zstd->Finish(acquire, emit);
      if (!s.ok()) fail(s);
      zstd = nullptr;  // finished
    }
    if (io.transfers_in_flight() > 0) poll(/*block=*/ready.empty());
    if (!status.ok() && io.transfers_in_flight() > 0) {
      written.clear();
      (void)io.Drain(&written);
      release(written);
    }
  }
  if (status.ok()) status = job.staging_status();
  return status;
}

absl::Status Persister::Commit(SaveJob& job, std::vector<std::unique_ptr<File>>& files,
                               const ShardCompressor* compressor, SaveStats* stats) {
  Manifest manifest;
  manifest.tensors.resize(job.tensors.size());
  for (size_t i = 0; i < job.plan.size(); ++i) {
    const PlannedShard& shard = job.plan[i];
    ShardLayout layout{shard.file_bytes, shard.padded_bytes};
    if (compressor != nullptr) layout = compressor->shards()[i];
    manifest.shards.push_back(ShardInfo{shard.file, layout.file_bytes});
    for (const PlannedRecord& r : shard.records) {
      const TensorView& t = job.tensors[r.tensor];
      TensorInfo& info = manifest.tensors[r.tensor];
      info.name = t.name;
      info.dtype = t.dtype;
      info.shape = t.shape;
      info.raw_bytes = t.nbytes;
      info.shard = shard.file;
      info.xxh3 = job.hashes[r.tensor];
      if (compressor != nullptr) {
        const RecordLayout& rl = compressor->records()[r.tensor];
        info.offset = rl.offset;
        info.stored_bytes = rl.stored_bytes;
        info.encoding = "zstd";
      } else {
        info.offset = r.offset;
        info.stored_bytes = t.nbytes;
        info.encoding = "raw";
      }
    }
    if (layout.file_bytes != layout.padded_bytes) {
      CKPT_RETURN_IF_ERROR(files[i]->Truncate(layout.file_bytes));
    }
    CKPT_RETURN_IF_ERROR(files[i]->Sync());
    CKPT_RETURN_IF_ERROR(files[i]->Close());
    job.Touch();
  }
  manifest.step = job.step();
  manifest.created_unix_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                 std::chrono::system_clock::now().time_since_epoch())
                                 .count();
  manifest.writer = ctx_.writer;
  manifest.extras_json = job.extras_json;
  CKPT_ASSIGN_OR_RETURN(std::string contents, SerializeManifest(manifest));
  CKPT_RETURN_IF_ERROR(
      WriteFileDurably(*ctx_.fs, *ctx_.queue, JoinPath(job.temp_dir, kManifestName), contents));
  job.Touch();
  CKPT_RETURN_IF_ERROR(CommitCheckpoint(*ctx_.fs, *ctx_.queue, ctx_.root, job.temp_dir, job.final_name));
  stats->tensor_bytes = manifest.tensor_bytes();
  stats->file_bytes = manifest.shard_bytes();
  return absl::OkStatus();
}

void Persister::Persist(SaveJob& job) {
  const Clock::time_point persist_start = Clock::now();
  std::vector<std::unique_ptr<File>> files;
  std::unique_ptr<ShardCompressor> compressor;
  absl::Status status = WriteChunks(job, files, &compressor);
  SaveStats stats;
  if (status.ok()) status = Commit(job, files, compressor.get(), &stats);
  if (!status.ok()) {
    files.clear();  // close what is open before removing the directory
    RemoveTreeBestEffort(*ctx_.fs, job.temp_dir);
    status = Annotate(status, absl::StrCat("save of step ", job.step(), " in ", ctx_.root));
  }
  stats.step = job.step();
  stats.dir = status.ok() ? JoinPath(ctx_.root, job.final_name) : "";
  stats.tensor_count = job.tensors.size();
  stats.shard_count = job.plan.size();
  stats.blocked_s = job.blocked_s;
  stats.staging_s = job.staging_s;
  stats.staging_wait_s = job.staging_wait_s;
  stats.persist_s = SecondsSince(persist_start);
  stats.seconds = SecondsSince(job.start_time);
  stats.persist_gbps = stats.persist_s > 0 ? stats.file_bytes / stats.persist_s / 1e9 : 0;
  stats.backend = ctx_.backend;
  job.Finish(std::move(status), std::move(stats));
}

}  // namespace ckpt::internal
