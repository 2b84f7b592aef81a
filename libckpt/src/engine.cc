#include "ckpt/engine.h"

#include <chrono>
#include "absl/container/flat_hash_set.h"

#include <nlohmann/json.hpp>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "commit/commit.h"
#include "format/manifest.h"
#include "format/names.h"
#include "format/shard_plan.h"
#include "io/backend.h"
#include "io/chunk_pool.h"
#include "io/small_file.h"
#include "util/status_macros.h"
#include "write/shard_writer.h"

namespace ckpt {
namespace {

using namespace internal;  // NOLINT: the engine is the glue of the internals

absl::Status ValidateSave(int64_t step, std::span<const TensorView> tensors,
                          absl::string_view extras_json) {
  if (step < 0) return absl::InvalidArgumentError(absl::StrCat("step ", step, " is negative"));
  absl::flat_hash_set<absl::string_view> names;
  names.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorView& t = tensors[i];
    absl::Status name_ok = ValidateTensorName(t.name);
    if (!name_ok.ok()) return Annotate(name_ok, absl::StrCat("tensor #", i));
    const std::string where = absl::StrCat("tensor \"", t.name, "\"");
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(absl::StrCat(where, " is given twice"));
    }
    if (!IsValidDType(t.dtype)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": unknown dtype ", static_cast<int>(t.dtype)));
    }
    if (t.shape.size() > kMaxRank) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": rank ", t.shape.size(), " > ", kMaxRank));
    }
    auto numel = NumElements(t.shape);
    if (!numel.ok()) return Annotate(numel.status(), where);
    const uint64_t elem = DTypeSize(t.dtype);
    if ((*numel != 0 && elem > UINT64_MAX / *numel) || *numel * elem != t.nbytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": shape holds ", *numel, " ", DTypeName(t.dtype), " elements but nbytes is ",
          t.nbytes));
    }
    if (t.nbytes > 0 && t.data == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": data is null"));
    }
  }
  auto extras = nlohmann::json::parse(extras_json, nullptr, /*allow_exceptions=*/false);
  if (extras.is_discarded() || !extras.is_object()) {
    return absl::InvalidArgumentError("extras must be a JSON object (valid UTF-8)");
  }
  return absl::OkStatus();
}

class EngineImpl final : public Engine {
 public:
  EngineImpl(std::string root, EngineOptions options, std::shared_ptr<FileSystem> fs,
             internal::IoBackend backend, ChunkPool pool)
      : root_(std::move(root)),
        options_(std::move(options)),
        fs_(std::move(fs)),
        backend_(std::move(backend)),
        pool_(std::move(pool)) {}

  absl::StatusOr<SaveStats> Save(int64_t step, std::span<const TensorView> tensors,
                                 absl::string_view extras_json) override {
    const auto start = std::chrono::steady_clock::now();
    CKPT_RETURN_IF_ERROR(ValidateSave(step, tensors, extras_json));
    absl::MutexLock lock(&mu_);
    const std::string final_name = CheckpointDirName(step);
    auto existing = fs_->Stat(JoinPath(root_, final_name));
    if (existing.ok()) {
      return absl::AlreadyExistsError(
          absl::StrCat("checkpoint for step ", step, " already exists in ", root_));
    }
    if (existing.status().code() != absl::StatusCode::kNotFound) return existing.status();

    std::vector<PlannedShard> plan =
        PlanShards(tensors, options_.shard_min_bytes, options_.shard_max_bytes);
    const std::string temp_dir = JoinPath(root_, TempDirName(step, absl::Uniform<uint64_t>(gen_)));
    CKPT_RETURN_IF_ERROR(fs_->CreateDir(temp_dir));
    Manifest manifest;
    absl::Status status = WriteCheckpointFiles(step, tensors, extras_json, plan, temp_dir, &manifest);
    if (status.ok()) {
      status = CommitCheckpoint(*fs_, *backend_.queue, root_, temp_dir, final_name);
    }
    if (!status.ok()) {
      RemoveTreeBestEffort(*fs_, temp_dir);
      return Annotate(status, absl::StrCat("save of step ", step, " in ", root_));
    }
    SaveStats stats;
    stats.step = step;
    stats.dir = JoinPath(root_, final_name);
    stats.tensor_bytes = manifest.tensor_bytes();
    stats.file_bytes = manifest.shard_bytes();
    stats.tensor_count = tensors.size();
    stats.shard_count = plan.size();
    stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    stats.backend = backend_.description;
    return stats;
  }

  const std::string& root() const override { return root_; }
  absl::string_view backend() const override { return backend_.description; }

 private:
  absl::Status WriteCheckpointFiles(int64_t step, std::span<const TensorView> tensors,
                                    absl::string_view extras_json,
                                    const std::vector<PlannedShard>& plan,
                                    const std::string& temp_dir, Manifest* manifest)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<uint64_t> hashes;
    CKPT_RETURN_IF_ERROR(WriteShards(*fs_, *backend_.queue, backend_.direct, pool_, temp_dir,
                                     tensors, plan, &hashes));
    manifest->step = step;
    manifest->created_unix_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                    std::chrono::system_clock::now().time_since_epoch())
                                    .count();
    manifest->writer = "ckpt 0.1.0";
    manifest->extras_json = std::string(extras_json);
    manifest->tensors.resize(tensors.size());
    for (const PlannedShard& shard : plan) {
      manifest->shards.push_back(ShardInfo{shard.file, shard.file_bytes});
      for (const PlannedRecord& r : shard.records) {
        const TensorView& t = tensors[r.tensor];
        TensorInfo& info = manifest->tensors[r.tensor];
        info.name = t.name;
        info.dtype = t.dtype;
        info.shape = t.shape;
        info.raw_bytes = t.nbytes;
        info.stored_bytes = t.nbytes;
        info.encoding = "raw";
        info.shard = shard.file;
        info.offset = r.offset;
        info.xxh3 = hashes[r.tensor];
      }
    }
    CKPT_ASSIGN_OR_RETURN(std::string contents, SerializeManifest(*manifest));
    return WriteFileDurably(*fs_, *backend_.queue, JoinPath(temp_dir, kManifestName), contents);
  }

  const std::string root_;
  const EngineOptions options_;
  const std::shared_ptr<FileSystem> fs_;
  absl::Mutex mu_;
  internal::IoBackend backend_ ABSL_GUARDED_BY(mu_);
  ChunkPool pool_ ABSL_GUARDED_BY(mu_);
  absl::BitGen gen_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<Engine>> Engine::Open(const std::string& root,
                                                     const EngineOptions& options) {
  if (root.empty()) return absl::InvalidArgumentError("checkpoint root is empty");
  std::shared_ptr<FileSystem> fs = options.fs != nullptr ? options.fs : PosixFileSystem();
  if (options.shard_min_bytes > options.shard_max_bytes) {
    return absl::InvalidArgumentError("shard_min_bytes is larger than shard_max_bytes");
  }
  auto stat = fs->Stat(root);
  if (!stat.ok() && stat.status().code() == absl::StatusCode::kNotFound && options.create_root) {
    CKPT_RETURN_IF_ERROR(fs->CreateDir(root));
    size_t slash = root.find_last_of('/');
    std::string parent = slash == std::string::npos ? "." : slash == 0 ? "/" : root.substr(0, slash);
    CKPT_RETURN_IF_ERROR(fs->SyncDir(parent));
    stat = fs->Stat(root);
  }
  if (!stat.ok()) return Annotate(stat.status(), "checkpoint root");
  if (!stat->is_directory) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint root ", root, " is not a directory"));
  }
  CKPT_ASSIGN_OR_RETURN(internal::IoBackend backend, OpenIoBackend(*fs, options.io, root));
  CKPT_ASSIGN_OR_RETURN(ChunkPool pool, ChunkPool::Create(options.io.chunk_bytes,
                                                          options.io.buffer_bytes,
                                                          backend.queue.get()));
  return std::unique_ptr<Engine>(
      new EngineImpl(root, options, std::move(fs), std::move(backend), std::move(pool)));
}

}  // namespace ckpt
