// ObjectFileSystem: a read-only FileSystem over the committed checkpoints of
// an s3:// root (ckpt/object_store.h, ckpt/object_tier.h). A step directory
// exists exactly when its commit marker does, and lists the files the marker
// names with the sizes it records: no LIST per step, no HEAD per file.
// Reads are ranged GETs; the IoQueue runs many at once on a pool of threads,
// each landing its bytes straight in the reader's buffer.
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <list>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "ckpt/object_tier.h"
#include "format/names.h"
#include "util/log.h"
#include "util/status_macros.h"

namespace ckpt {
namespace {

using internal::Log;
using internal::LogLevel;

absl::Status ReadOnly(absl::string_view path, absl::string_view what) {
  return absl::UnimplementedError(absl::StrCat(
      "cannot ", what, " ", path,
      ": s3:// roots are read-only (checkpoints reach a bucket only through the commit protocol); "
      "save to a local directory and move checkpoints to the bucket with "
      "`ckpt-retain --root DIR --cold-dir s3://BUCKET/PREFIX`"));
}

// Small reads (many small tensors, manifests) would each cost a request
// (on S3 a round trip of tens of ms): they are served from windows of
// `kWindowBytes` fetched once, the last `kWindows` kept (LRU) for the whole
// file system. Large reads go straight to the caller's buffer.
class WindowCache {
 public:
  static constexpr uint64_t kWindowBytes = uint64_t{4} << 20;
  static constexpr uint64_t kSmallRead = uint64_t{512} << 10;
  static constexpr size_t kWindows = 8;

  // The window of `key` (of `size` bytes) holding `offset`, fetched if
  // missing -- once: readers of a window being fetched wait for that fetch
  // (many small records of one shard are read at once).
  absl::StatusOr<std::shared_ptr<const std::string>> Get(ObjectStore& store, const std::string& key,
                                                         uint64_t size, uint64_t offset) {
    const uint64_t start = AlignDown(offset, kWindowBytes);
    const std::string id = absl::StrCat(key, "@", start);
    std::shared_future<Fetched> pending;
    std::promise<Fetched> mine;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = windows_.begin(); it != windows_.end(); ++it) {
        if (it->first == id) {
          auto hit = it->second;
          windows_.splice(windows_.begin(), windows_, it);
          return hit;
        }
      }
      auto it = fetching_.find(id);
      if (it != fetching_.end()) {
        pending = it->second;
      } else {
        fetching_[id] = mine.get_future().share();
      }
    }
    if (pending.valid()) return pending.get();  // another reader fetches it
    Fetched fetched = Fetch(store, key, size, start);
    std::lock_guard<std::mutex> lock(mu_);
    if (fetched.ok()) {
      windows_.emplace_front(id, *fetched);
      if (windows_.size() > kWindows) windows_.pop_back();
    }
    fetching_.erase(id);
    mine.set_value(fetched);
    return fetched;
  }

 private:
  using Fetched = absl::StatusOr<std::shared_ptr<const std::string>>;

  static Fetched Fetch(ObjectStore& store, const std::string& key, uint64_t size, uint64_t start) {
    auto bytes = std::make_shared<std::string>(std::min(kWindowBytes, size - start), '\0');
    size_t done = 0;
    while (done < bytes->size()) {
      CKPT_ASSIGN_OR_RETURN(size_t n, store.GetRange(key, start + done,
                                                     std::span<char>(*bytes).subspan(done)));
      if (n == 0) break;
      done += n;
    }
    bytes->resize(done);
    return std::shared_ptr<const std::string>(std::move(bytes));
  }

  std::mutex mu_;
  std::list<std::pair<std::string, std::shared_ptr<const std::string>>> windows_;  // GUARDED_BY(mu_)
  std::map<std::string, std::shared_future<Fetched>> fetching_;                     // GUARDED_BY(mu_)
};

class ObjectFile final : public File {
 public:
  ObjectFile(std::shared_ptr<ObjectStore> store, std::shared_ptr<WindowCache> cache, std::string path,
             std::string key, uint64_t size)
      : store_(std::move(store)), cache_(std::move(cache)), path_(std::move(path)),
        key_(std::move(key)), size_(size) {}
  const std::string& path() const override { return path_; }
  bool direct() const override { return false; }
  absl::StatusOr<size_t> ReadAt(uint64_t offset, std::span<char> out) override {
    if (offset >= size_) return 0;
    out = out.subspan(0, std::min<uint64_t>(out.size(), size_ - offset));
    if (out.size() <= WindowCache::kSmallRead &&
        AlignDown(offset, WindowCache::kWindowBytes) ==
            AlignDown(offset + out.size() - 1, WindowCache::kWindowBytes)) {
      CKPT_ASSIGN_OR_RETURN(std::shared_ptr<const std::string> w,
                            cache_->Get(*store_, key_, size_, offset));
      const uint64_t at = offset - AlignDown(offset, WindowCache::kWindowBytes);
      if (at + out.size() > w->size()) {
        return absl::DataLossError(absl::StrCat(path_, ": object ends before ", offset + out.size(),
                                                " bytes, its commit marker says ", size_));
      }
      std::memcpy(out.data(), w->data() + at, out.size());
      return out.size();
    }
    size_t done = 0;
    while (done < out.size()) {
      CKPT_ASSIGN_OR_RETURN(size_t n, store_->GetRange(key_, offset + done, out.subspan(done)));
      if (n == 0) {
        return absl::DataLossError(absl::StrCat(path_, ": object ends at ", offset + done,
                                                " bytes, its commit marker says ", size_));
      }
      done += n;
    }
    return done;
  }
  absl::Status WriteAt(uint64_t, std::span<const char>) override { return ReadOnly(path_, "write"); }
  absl::Status Sync() override { return ReadOnly(path_, "sync"); }
  absl::Status Truncate(uint64_t) override { return ReadOnly(path_, "truncate"); }
  absl::StatusOr<uint64_t> Size() override { return size_; }
  absl::Status DropCache() override { return absl::OkStatus(); }
  absl::Status Close() override { return absl::OkStatus(); }

 private:
  std::shared_ptr<ObjectStore> store_;
  std::shared_ptr<WindowCache> cache_;
  const std::string path_, key_;
  const uint64_t size_;
};

// Transfers of object files on min(depth, 16) threads.
class ObjectIoQueue final : public IoQueue {
 public:
  explicit ObjectIoQueue(size_t depth) : depth_(depth) {
    for (size_t i = 0; i < std::min<size_t>(depth, 16); ++i) threads_.emplace_back([this] { Loop(); });
  }
  ~ObjectIoQueue() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    work_cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  absl::string_view name() const override { return "s3-ranged-get"; }
  size_t depth() const override { return depth_; }
  absl::Status RegisterBuffers(std::span<const std::span<char>>) override {
    return absl::UnimplementedError("object I/O queue registers no buffers");
  }
  absl::Status Submit(std::span<const IoOp> ops) override {
    for (const IoOp& op : ops) {
      if (dynamic_cast<ObjectFile*>(op.file) == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat(op.file != nullptr ? op.file->path() : "null file",
                         ": not a file of the object file system"));
      }
      if (op.kind != IoOp::Kind::kRead) return ReadOnly(op.file->path(), "write");
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const IoOp& op : ops) work_.push_back(op);
    }
    work_cv_.notify_all();
    return absl::OkStatus();
  }
  absl::Status Reap(size_t min_complete, std::vector<IoCompletion>* out) override {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return done_.size() >= min_complete; });
    out->insert(out->end(), done_.begin(), done_.end());
    done_.clear();
    return absl::OkStatus();
  }

 private:
  void Loop() {
    for (;;) {
      IoOp op;
      {
        std::unique_lock<std::mutex> lock(mu_);
        work_cv_.wait(lock, [&] { return stop_ || !work_.empty(); });
        if (stop_) return;
        op = work_.front();
        work_.pop_front();
      }
      auto n = op.file->ReadAt(op.offset, std::span<char>(static_cast<char*>(op.buf), op.length));
      int64_t result = 0;
      if (n.ok()) {
        result = static_cast<int64_t>(*n);
      } else {
        // The queue speaks errno; the store's message (bucket, key, HTTP
        // status, request id) goes to the log.
        Log(LogLevel::kError, std::string(n.status().message()));
        result = absl::IsNotFound(n.status()) ? -ENOENT
                 : absl::IsPermissionDenied(n.status()) ? -EACCES
                                                         : -EIO;
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        done_.push_back(IoCompletion{op.tag, result});
      }
      done_cv_.notify_all();
    }
  }

  const size_t depth_;
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<IoOp> work_;            // GUARDED_BY(mu_)
  std::vector<IoCompletion> done_;   // GUARDED_BY(mu_)
  bool stop_ = false;                // GUARDED_BY(mu_)
  std::vector<std::thread> threads_;
};

class ObjectFs final : public FileSystem {
 public:
  explicit ObjectFs(std::shared_ptr<ObjectStore> store) : store_(std::move(store)) {}
  absl::string_view name() const override { return "s3"; }

  absl::StatusOr<std::unique_ptr<File>> Open(const std::string& path,
                                             const OpenOptions& options) override {
    if (options.write || options.create || options.truncate) return ReadOnly(path, "open for writing");
    if (options.direct) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": no O_DIRECT on an object store"));
    }
    CKPT_ASSIGN_OR_RETURN(FileStat st, Stat(path));
    if (st.is_directory) {
      return absl::FailedPreconditionError(absl::StrCat(path, " is a directory, not a file"));
    }
    CKPT_ASSIGN_OR_RETURN(std::string key, KeyOf(path));
    return std::unique_ptr<File>(new ObjectFile(store_, cache_, path, key, st.size));
  }
  absl::Status CreateDir(const std::string& path) override { return ReadOnly(path, "create"); }
  absl::Status RemoveFile(const std::string& path) override { return ReadOnly(path, "remove"); }
  absl::Status RemoveDir(const std::string& path) override { return ReadOnly(path, "remove"); }
  absl::Status Rename(const std::string& from, const std::string&, RenameMode) override {
    return ReadOnly(from, "rename");
  }
  absl::Status SyncDir(const std::string& path) override { return ReadOnly(path, "sync"); }

  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) override {
    CKPT_ASSIGN_OR_RETURN(std::string key, KeyOf(path));
    const auto [parent, base] = Split(key);
    if (auto step = internal::ParseCheckpointDirName(base)) {
      CKPT_ASSIGN_OR_RETURN(std::shared_ptr<const CommitMarker> m, Marker(parent, *step, path));
      std::vector<std::string> names;
      for (const CommitMarker::File& f : m->files) names.push_back(f.name);
      return names;
    }
    // A root: its committed steps, and plain objects (a LATEST, say); steps
    // without a marker and ckpt's own objects (.commit, .ckpt-*) stay unseen.
    const std::string dir = key.empty() ? "" : key + "/";
    CKPT_ASSIGN_OR_RETURN(ObjectListing listing, store_->List(dir, "/"));
    std::vector<std::string> names;
    for (const ObjectInfo& o : listing.objects) {
      absl::string_view name = absl::string_view(o.key).substr(dir.size());
      if (absl::ConsumeSuffix(&name, ".commit")) {
        if (internal::ParseCheckpointDirName(name)) names.emplace_back(name);
      } else if (!name.empty() && name[0] != '.') {
        names.emplace_back(name);
      }
    }
    return names;
  }

  absl::StatusOr<FileStat> Stat(const std::string& path) override {
    CKPT_ASSIGN_OR_RETURN(std::string key, KeyOf(path));
    FileStat st;
    if (key.empty()) {
      st.is_directory = true;
      return st;
    }
    const auto [parent, base] = Split(key);
    if (auto step = internal::ParseCheckpointDirName(base)) {
      CKPT_ASSIGN_OR_RETURN(std::shared_ptr<const CommitMarker> m, Marker(parent, *step, path));
      st.is_directory = true;
      st.mtime_ns = m->uploaded_unix_ns;
      return st;
    }
    const auto [grandparent, parent_base] = Split(parent);
    if (auto step = internal::ParseCheckpointDirName(parent_base)) {
      CKPT_ASSIGN_OR_RETURN(std::shared_ptr<const CommitMarker> m, Marker(grandparent, *step, path));
      for (const CommitMarker::File& f : m->files) {
        if (f.name == base) {
          st.size = f.bytes;
          st.mtime_ns = m->uploaded_unix_ns;
          return st;
        }
      }
      return absl::NotFoundError(absl::StrCat(path, ": not in its step's commit marker"));
    }
    auto head = store_->Head(key);
    if (head.ok()) {
      st.size = head->size;
      return st;
    }
    if (!absl::IsNotFound(head.status())) return head.status();
    // Prefixes are implicit in a bucket: any other path is a (maybe empty)
    // directory.
    st.is_directory = true;
    return st;
  }

  absl::StatusOr<std::unique_ptr<IoQueue>> NewIoQueue(IoQueueKind, size_t depth) override {
    return std::unique_ptr<IoQueue>(new ObjectIoQueue(depth));
  }

 private:
  absl::StatusOr<std::string> KeyOf(const std::string& path) const {
    const std::string root = absl::StrCat("s3://", store_->bucket());
    absl::string_view rest = path;
    if (!absl::ConsumePrefix(&rest, root) || (!rest.empty() && rest[0] != '/')) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, " is not in ", root, " (the bucket this file system serves)"));
    }
    while (absl::ConsumePrefix(&rest, "/")) {
    }
    while (absl::ConsumeSuffix(&rest, "/")) {
    }
    return std::string(rest);
  }

  static std::pair<std::string, std::string> Split(const std::string& key) {
    const size_t slash = key.rfind('/');
    if (slash == std::string::npos) return {"", key};
    return {key.substr(0, slash), key.substr(slash + 1)};
  }

  // The marker of `step` under `prefix` (cached: a marker never changes while
  // it exists). kNotFound naming `path` when there is none: the step is not
  // committed in the bucket.
  absl::StatusOr<std::shared_ptr<const CommitMarker>> Marker(const std::string& prefix, int64_t step,
                                                             const std::string& path) {
    const std::string key = MarkerKey(prefix, step);
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = markers_.find(key);
      if (it != markers_.end()) return it->second;
    }
    CKPT_ASSIGN_OR_RETURN(std::optional<CommitMarker> m, ReadCommitMarker(*store_, prefix, step));
    if (!m.has_value()) {
      return absl::NotFoundError(absl::StrCat(path, ": no commit marker (not a committed step)"));
    }
    auto shared = std::make_shared<const CommitMarker>(std::move(*m));
    std::lock_guard<std::mutex> lock(mu_);
    markers_[key] = shared;
    return shared;
  }

  std::shared_ptr<ObjectStore> store_;
  std::shared_ptr<WindowCache> cache_ = std::make_shared<WindowCache>();
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<const CommitMarker>> markers_;  // GUARDED_BY(mu_)
};

}  // namespace

absl::StatusOr<std::shared_ptr<FileSystem>> ObjectFileSystem(std::shared_ptr<ObjectStore> store) {
  if (store == nullptr) return absl::InvalidArgumentError("ObjectFileSystem: no store");
  return std::shared_ptr<FileSystem>(new ObjectFs(std::move(store)));
}

absl::StatusOr<std::shared_ptr<FileSystem>> FileSystemForRoot(absl::string_view root,
                                                              std::shared_ptr<FileSystem> fallback,
                                                              const ObjectStoreOptions& options) {
  if (!IsObjectUrl(root)) return fallback != nullptr ? fallback : PosixFileSystem();
  // An explicit file system that serves object roots is used as given.
  if (fallback != nullptr && fallback->name() == "s3") return fallback;
  CKPT_ASSIGN_OR_RETURN(std::shared_ptr<ObjectStore> store, OpenObjectStore(root, options));
  return ObjectFileSystem(std::move(store));
}

}  // namespace ckpt
