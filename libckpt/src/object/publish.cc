// PublishCheckpoint: one committed local checkpoint into a bucket, under the
// commit protocol of ckpt/object_tier.h.
#include <openssl/evp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <mutex>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "ckpt/catalog.h"
#include "ckpt/object_tier.h"
#include "format/names.h"
#include "read/rank_copy.h"
#include "util/hash.h"
#include "util/log.h"
#include "util/path.h"
#include "util/status_macros.h"
#include "object/crc32c.h"
#include "util/worker_pool.h"

namespace ckpt {
namespace {

using internal::Log;
using internal::LogLevel;
using internal::Annotate;
using internal::WorkerPool;

struct LocalFile {
  std::string name;
  std::string path;
  std::string key;
  uint64_t bytes = 0;
  uint64_t xxh3 = 0;
};

// The first error of many workers.
class FirstError {
 public:
  void Note(const absl::Status& s) {
    if (s.ok()) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (status_.ok()) status_ = s;
  }
  absl::Status Get() {
    std::lock_guard<std::mutex> lock(mu_);
    return status_;
  }

 private:
  std::mutex mu_;
  absl::Status status_;  // GUARDED_BY(mu_)
};

std::string Identity() {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  return absl::StrCat(host, " pid ", getpid());
}

absl::StatusOr<std::unique_ptr<File>> OpenForRead(FileSystem& fs, const std::string& path) {
  OpenOptions o;
  o.regular_only = true;
  return fs.Open(path, o);
}

// Reads `bytes` at `offset` of the local file into `buf`; a file that got
// shorter since it was listed is kDataLoss.
absl::Status ReadPiece(FileSystem& fs, const LocalFile& f, uint64_t offset, std::span<char> buf) {
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<File> file, OpenForRead(fs, f.path));
  CKPT_ASSIGN_OR_RETURN(size_t n, file->ReadAt(offset, buf));
  if (n != buf.size()) {
    return absl::DataLossError(absl::StrCat(f.path, " changed while it was being uploaded"));
  }
  return file->Close();
}

// Part-sized buffers, reused: each upload stream's part buffer is allocated
// (and its pages faulted in) once, not once per part. (Fresh memory costs a
// memset and page faults per byte: measured as ~1/8 of an upload's CPU.)
class PartBuffers {
 public:
  explicit PartBuffers(size_t bytes) : bytes_(bytes) {}

  std::unique_ptr<char[]> Take() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!free_.empty()) {
        std::unique_ptr<char[]> buf = std::move(free_.back());
        free_.pop_back();
        return buf;
      }
    }
    return std::make_unique_for_overwrite<char[]>(bytes_);
  }
  void Give(std::unique_ptr<char[]> buf) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(std::move(buf));
  }

 private:
  const size_t bytes_;
  std::mutex mu_;
  std::vector<std::unique_ptr<char[]>> free_;  // GUARDED_BY(mu_)
};

// `x-amz-meta-ckpt-xxh3` of a multipart upload, whose XXH3 is not known when
// it begins.
constexpr char kHashedInParts[] = "in-marker";

// A multipart file's XXH3, from its parts as the upload workers read them:
// each part is handed over in turn (part k waits until part k-1 was, and the
// workers take parts in order, so the wait is for a read already under way).
// The file is hashed as it is read for upload, not read a second time. A part
// that was not read passes its turn and spoils the hash (its error is the
// upload's).
class PartHasher {
 public:
  void Add(int part, std::span<const char> bytes, bool read) {
    std::unique_lock<std::mutex> lock(mu_);
    turn_.wait(lock, [&] { return next_part_ == part; });
    if (read) hash_.Update(bytes.data(), bytes.size());
    else spoiled_ = true;
    ++next_part_;
    turn_.notify_all();
  }
  // The file's XXH3, once every part was added; nullopt if one was not read.
  std::optional<uint64_t> Digest() {
    std::lock_guard<std::mutex> lock(mu_);
    if (spoiled_) return std::nullopt;
    return hash_.Digest();
  }

 private:
  std::mutex mu_;
  std::condition_variable turn_;
  int next_part_ = 1;            // GUARDED_BY(mu_)
  bool spoiled_ = false;         // GUARDED_BY(mu_)
  internal::Xxh3Stream hash_;    // GUARDED_BY(mu_)
};

// One unit of upload work: a whole small file, or one part of a large one.
struct UploadTask {
  LocalFile* file;
  std::string upload_id;  // empty: a single PutObject
  int part = 0;           // 1-based
  uint64_t offset = 0;
  uint64_t bytes = 0;
  std::string held_etag;  // the server holds this part already (resumed), if it matches
};

// The ETag S3 gives a part: the MD5 of its bytes, hex, quoted.
std::string PartEtag(std::span<const char> data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_Digest(data.data(), data.size(), md, &n, EVP_md5(), nullptr);
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out = "\"";
  for (unsigned int i = 0; i < n; ++i) {
    out.push_back(kDigits[md[i] >> 4]);
    out.push_back(kDigits[md[i] & 15]);
  }
  out.push_back('"');
  return out;
}

std::string Unquoted(absl::string_view etag) {
  if (etag.size() >= 2 && etag.front() == '"' && etag.back() == '"') etag = etag.substr(1, etag.size() - 2);
  return std::string(etag);
}

class Publisher {
 public:
  Publisher(FileSystem& fs, ObjectStore& store, const PublishOptions& options)
      : fs_(fs), store_(store), options_(options),
        pool_(std::max(1, options.streams), "ckpt-upload", 0), buffers_(options.part_bytes) {}

  // Uploads `files`. Returns those the store did not confirm: a file is
  // confirmed when the ETag of each of its PUTs (or of each part the server
  // held from an interrupted run) is the MD5 of the bytes sent, as the store
  // computed them on what it received (AWS without SSE-KMS/SSE-C, MinIO,
  // Ceph, GCS's XML API, moto). A file whose ETag is anything else -- bytes
  // damaged on the way, or a store whose ETags are not MD5s -- is read back.
  absl::StatusOr<std::vector<LocalFile*>> Upload(std::vector<LocalFile*> files) {
    std::vector<UploadTask> tasks;
    std::vector<std::pair<LocalFile*, std::string>> multipart;
    std::map<LocalFile*, std::unique_ptr<PartHasher>> hashers;  // of each multipart file
    absl::Status status;
    for (LocalFile* f : files) {
      if (f->bytes <= options_.part_bytes) {
        tasks.push_back(UploadTask{f, "", 0, 0, f->bytes, ""});
        continue;
      }
      // An interrupted run's upload of this file: resumed from the parts
      // the server holds (each checked against the local bytes' MD5).
      std::map<int, PartInfo> held;
      absl::StatusOr<std::string> id = absl::NotFoundError("");
      if (auto r = resume_.find(f->key); r != resume_.end()) {
        auto parts = store_.ListParts(f->key, r->second);
        ++requests_;
        if (parts.ok()) {
          id = r->second;
          for (const PartInfo& p : *parts) held[p.number] = p;
        } else {
          (void)store_.AbortMultipartUpload(f->key, r->second);
        }
        resume_.erase(r);
      }
      if (!id.ok()) {
        // (Its XXH3 is not known yet: hashed as its parts are read.)
        id = store_.CreateMultipartUpload(
            f->key, {false, {{"ckpt-xxh3", kHashedInParts}}, options_.storage_class});
        ++requests_;
      }
      if (!id.ok()) {
        status = id.status();
        break;
      }
      multipart.emplace_back(f, *id);
      hashers[f] = std::make_unique<PartHasher>();
      int part = 1;
      for (uint64_t off = 0; off < f->bytes; off += options_.part_bytes, ++part) {
        const uint64_t bytes = std::min(options_.part_bytes, f->bytes - off);
        auto h = held.find(part);
        tasks.push_back(UploadTask{f, *id, part, off, bytes,
                                   h != held.end() && h->second.size == bytes ? h->second.etag : ""});
      }
    }
    std::vector<UploadedPart> parts(tasks.size());
    std::vector<char> confirmed(tasks.size(), 0);
    FirstError error;
    error.Note(status);
    if (status.ok()) {
      pool_.ParallelFor(tasks.size(), [&](size_t i) {
        const UploadTask& t = tasks[i];
        PartHasher* hasher = t.upload_id.empty() ? nullptr : hashers.at(t.file).get();
        if (!error.Get().ok()) {
          if (hasher != nullptr) hasher->Add(t.part, {}, false);  // its turn, passed
          return;
        }
        std::unique_ptr<char[]> held = buffers_.Take();
        absl::Cleanup give_back = [&] { buffers_.Give(std::move(held)); };
        const std::span<char> buf(held.get(), t.bytes);
        absl::Status s = ReadPiece(fs_, *t.file, t.offset, buf);
        if (hasher != nullptr) hasher->Add(t.part, buf, s.ok());
        else if (s.ok()) t.file->xxh3 = internal::Xxh3(buf.data(), buf.size());  // the whole file
        if (!s.ok()) {
          error.Note(s);
          return;
        }
        const std::string md5 = Unquoted(PartEtag(buf));
        if (!t.held_etag.empty() && md5 == Unquoted(t.held_etag)) {
          parts[i] = UploadedPart{t.part, t.held_etag, internal::Crc32cBase64(internal::Crc32c(buf))};
          confirmed[i] = 1;
          ++resumed_;
          return;  // the server has these bytes: not sent again
        }
        absl::StatusOr<std::string> etag;
        if (t.upload_id.empty()) {
          etag = store_.Put(t.file->key, buf, {false, Metadata(*t.file), options_.storage_class});
        } else {
          auto part = store_.UploadPart(t.file->key, t.upload_id, t.part, buf);
          if (part.ok()) parts[i] = *part;
          etag = part.ok() ? absl::StatusOr<std::string>(part->etag) : part.status();
        }
        ++requests_;
        if (etag.ok()) confirmed[i] = Unquoted(*etag) == md5;
        error.Note(etag.status());
      });
    }
    for (const auto& [f, id] : multipart) {
      if (error.Get().ok()) {
        std::optional<uint64_t> xxh3 = hashers.at(f)->Digest();
        if (!xxh3.has_value()) {  // (a part unread has noted its error)
          error.Note(absl::InternalError(absl::StrCat(f->path, " was not read whole")));
          continue;
        }
        f->xxh3 = *xxh3;
        std::vector<UploadedPart> mine;
        for (size_t i = 0; i < tasks.size(); ++i) {
          if (tasks[i].file == f) mine.push_back(parts[i]);
        }
        error.Note(store_.CompleteMultipartUpload(f->key, id, mine, false).status());
        ++requests_;
      }
      // (A failed upload stays on the server: the next run resumes it, or
      // ReclaimObjectOrphans aborts it once stale.)
    }
    CKPT_RETURN_IF_ERROR(error.Get());
    std::vector<LocalFile*> unconfirmed;
    for (size_t i = 0; i < tasks.size(); ++i) {
      if (!confirmed[i] && (unconfirmed.empty() || unconfirmed.back() != tasks[i].file)) {
        unconfirmed.push_back(tasks[i].file);
      }
    }
    return unconfirmed;
  }

  // Reads every object back; returns those whose size or XXH3 differ from
  // the local file's.
  absl::StatusOr<std::vector<LocalFile*>> Verify(std::vector<LocalFile*> files) {
    std::vector<char> differs(files.size(), 0);
    FirstError error;
    pool_.ParallelFor(files.size(), [&](size_t i) {
      const LocalFile& f = *files[i];
      // One byte more than the file: a short answer ends the loop, no extra GET
      // past the end (for a file that fits one GET).
      std::unique_ptr<char[]> held = buffers_.Take();
      absl::Cleanup give_back = [&] { buffers_.Give(std::move(held)); };
      const std::span<char> buf(held.get(), std::min<uint64_t>(options_.part_bytes, f.bytes + 1));
      internal::Xxh3Stream hash;
      uint64_t offset = 0;
      for (;;) {
        auto n = store_.GetRange(f.key, offset, std::span<char>(buf));
        ++requests_;
        if (!n.ok()) {
          error.Note(n.status());
          return;
        }
        hash.Update(buf.data(), *n);
        offset += *n;
        if (*n < buf.size() || offset > f.bytes) break;
      }
      if (offset != f.bytes || hash.Digest() != f.xxh3) {
        Log(LogLevel::kWarning,
            absl::StrCat("s3://", store_.bucket(), "/", f.key, " read back as ", offset,
                         " bytes with xxh3 ", internal::HashToHex(hash.Digest()), ", not ", f.bytes,
                         " bytes with xxh3 ", internal::HashToHex(f.xxh3)));
        differs[i] = 1;
      }
    });
    CKPT_RETURN_IF_ERROR(error.Get());
    std::vector<LocalFile*> bad;
    for (size_t i = 0; i < files.size(); ++i) {
      if (differs[i]) bad.push_back(files[i]);
    }
    return bad;
  }

  uint64_t requests() const { return requests_; }
  uint64_t resumed() const { return resumed_; }
  // Uploads (key -> id) to resume rather than start.
  void Resume(std::map<std::string, std::string> uploads) { resume_ = std::move(uploads); }
  WorkerPool& pool() { return pool_; }

 private:
  // The tag that marks an object as ckpt's: the file's XXH3 where it goes
  // up whole, kHashedInParts for a multipart upload (begun before its parts
  // are read; the commit marker lists every file's XXH3).
  static std::map<std::string, std::string> Metadata(const LocalFile& f) {
    return {{"ckpt-xxh3", internal::HashToHex(f.xxh3)}};
  }

  FileSystem& fs_;
  ObjectStore& store_;
  const PublishOptions& options_;
  WorkerPool pool_;
  PartBuffers buffers_;
  std::atomic<uint64_t> requests_{0};
  std::atomic<uint64_t> resumed_{0};
  std::map<std::string, std::string> resume_;  // the calling thread's
};

// The rank whose part a file "rank-<5 digits>.…" is (format/names.h), or
// nullopt for a file of no rank's part.
std::optional<int> RankOfFile(absl::string_view name) {
  int rank = 0;
  if (!absl::ConsumePrefix(&name, "rank-") || name.size() < 6 || name[5] != '.' ||
      !std::all_of(name.begin(), name.begin() + 5, [](char c) { return c >= '0' && c <= '9'; }) ||
      !absl::SimpleAtoi(name.substr(0, 5), &rank)) {
    return std::nullopt;
  }
  return rank;
}

// Every file of the step directory `names` is listed, with its size, in
// `listed` (once), and nothing else is (with `copy_of`, the step directory
// is that rank's copy: the rest of `listed` must be every other rank's
// files, its manifest included): else kFailedPrecondition naming what is
// missing or extra.
absl::Status CheckCoversStep(FileSystem& fs, const CheckpointSummary& hot, const std::vector<std::string>& names,
                             const std::vector<CommitMarker::File>& listed, const std::string& where,
                             std::optional<int> copy_of) {
  std::map<std::string, uint64_t> sizes;
  for (const CommitMarker::File& f : listed) {
    if (!sizes.emplace(f.name, f.bytes).second) {
      return absl::InvalidArgumentError(absl::StrCat(f.name, " is listed twice for ", where));
    }
  }
  for (const std::string& name : names) {
    auto it = sizes.find(name);
    if (it == sizes.end()) {
      return absl::FailedPreconditionError(absl::StrCat(
          internal::JoinPath(hot.dir, name), " was not published (no rank listed it): no commit marker for ", where));
    }
    CKPT_ASSIGN_OR_RETURN(FileStat st, fs.Stat(internal::JoinPath(hot.dir, name)));
    if (st.size != it->second) {
      return absl::FailedPreconditionError(absl::StrCat(internal::JoinPath(hot.dir, name), " has ", st.size,
                                                        " bytes, its rank published ", it->second));
    }
    sizes.erase(it);
  }
  if (!copy_of.has_value()) {
    if (!sizes.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(sizes.begin()->first, " was published for ", where,
                                                        " but is not in ", hot.dir));
    }
    return absl::OkStatus();
  }
  // A rank's copy holds its own files only: the others' must be files of
  // the checkpoint's other ranks, every one of which published its manifest.
  for (int r = 0; r < hot.world_size; ++r) {
    if (r != *copy_of && sizes.count(internal::RankManifestName(r)) == 0) {
      return absl::FailedPreconditionError(absl::StrCat("rank ", r, "'s part of ", where,
                                                        " was not published (its manifest is not listed)"));
    }
  }
  for (const auto& [name, bytes] : sizes) {
    const std::optional<int> rank = RankOfFile(name);
    if (!rank.has_value() || *rank >= hot.world_size || *rank == *copy_of) {
      return absl::FailedPreconditionError(absl::StrCat(name, " was published for ", where,
                                                        " but is no file of its other ranks (",
                                                        hot.world_size, " ranks; ", hot.dir,
                                                        " is rank ", *copy_of, "'s copy)"));
    }
  }
  return absl::OkStatus();
}

bool SameCheckpoint(const CommitMarker& m, const CheckpointSummary& hot) {
  const uint64_t hot_identity = hot.compacted ? hot.compacted_from_manifest_xxh3 : hot.manifest_xxh3;
  return m.manifest_xxh3 == hot.manifest_xxh3 ||
         (m.compacted && m.compacted_from_manifest_xxh3 == hot_identity);
}

// What one call publishes of a step: every file and the marker
// (PublishCheckpoint), one rank's files and no marker (PublishOptions::part),
// or what the ranks did not, then the marker over all (CommitPublishedParts).
class Selection {
 public:
  Selection(std::optional<int> part, const std::vector<CommitMarker::File>* published)
      : part_(part), published_(published) {
    if (published_ != nullptr) {
      for (const CommitMarker::File& f : *published_) published_names_.insert(f.name);
    }
  }
  // Whether this call uploads the step's file `name`: a rank's own files;
  // for the commit of the parts, the files of no rank (the global manifest)
  // -- a rank's file the ranks did not list is missing, not the committer's.
  bool Owns(absl::string_view name) const {
    if (part_.has_value()) return absl::StartsWith(name, internal::RankFilePrefix(*part_));
    if (published_ == nullptr) return true;
    return published_names_.count(std::string(name)) == 0 && !RankOfFile(name).has_value();
  }
  bool marker() const { return !part_.has_value(); }
  // Files the ranks published (for the marker), or null.
  const std::vector<CommitMarker::File>* published() const { return published_; }

 private:
  std::optional<int> part_;
  const std::vector<CommitMarker::File>* published_;
  std::set<std::string> published_names_;
};

}  // namespace

absl::Status CheckStorageClass(absl::string_view storage_class) {
  if (storage_class.empty()) return absl::OkStatus();
  const bool name = std::all_of(storage_class.begin(), storage_class.end(), [](char c) {
    return absl::ascii_isupper(c) || absl::ascii_isdigit(c) || c == '_';
  });
  if (!name) {
    return absl::InvalidArgumentError(absl::StrCat(
        "storage class '", storage_class,
        "': not a storage class name (upper-case letters, digits and '_', e.g. STANDARD_IA)"));
  }
  if (storage_class == "GLACIER" || storage_class == "DEEP_ARCHIVE") {
    return absl::InvalidArgumentError(absl::StrCat(
        "storage class ", storage_class,
        ": its objects cannot be read without a restore request, so neither ckpt's check after "
        "the upload nor a restore could read them; use GLACIER_IR (instant retrieval) or "
        "STANDARD_IA"));
  }
  return absl::OkStatus();
}

namespace {

absl::StatusOr<PublishStats> Publish(const std::string& root, int64_t step, ObjectStore& store,
                                     absl::string_view prefix, const PublishOptions& options,
                                     const Selection& selection) {
  std::shared_ptr<FileSystem> fs = options.fs != nullptr ? options.fs : PosixFileSystem();
  if (options.part_bytes == 0) return absl::InvalidArgumentError("PublishOptions::part_bytes is 0");
  CKPT_RETURN_IF_ERROR(CheckStorageClass(options.storage_class));
  CKPT_ASSIGN_OR_RETURN(CheckpointSummary hot,
                        options.copy_of.has_value() ? internal::SummarizeRankCopy(root, step, fs, *options.copy_of)
                                                    : SummarizeCheckpoint(root, step, fs));
  if (!hot.manifest_status.ok()) return hot.manifest_status;
  const std::string where = absl::StrCat("s3://", store.bucket(), "/", StepPrefix(prefix, step));
  const std::string step_keys = StepPrefix(prefix, step) + "/";
  PublishStats stats;

  // (1) Published before (by an interrupted run)?
  auto read = ReadCommitMarker(store, prefix, step);
  ++stats.requests;
  // A marker that fails its own checksum commits nothing (readers skip the
  // step as damaged): it is replaced below, from the local copy.
  const bool damaged_marker = absl::IsDataLoss(read.status());
  if (!read.ok() && !damaged_marker) return read.status();
  if (damaged_marker) {
    Log(LogLevel::kWarning, absl::StrCat(read.status().message(), "; publishing step ", step,
                                         " again over it"));
  }
  std::optional<CommitMarker> existing = read.ok() ? *read : std::nullopt;
  if (existing.has_value()) {
    if (!SameCheckpoint(*existing, hot)) {
      return absl::AlreadyExistsError(absl::StrCat(where, " is committed and holds another checkpoint"));
    }
    stats.already_there = true;
    // Uploads left under a committed step are no one's: abort them.
    auto left = store.ListMultipartUploads(step_keys);
    if (left.ok()) {
      for (const MultipartUploadInfo& u : *left) (void)store.AbortMultipartUpload(u.key, u.upload_id);
    }
    for (const CommitMarker::File& f : existing->files) {
      if (selection.Owns(f.name)) stats.published.push_back(f);
    }
    return stats;
  }
  // (2) A chain is whole in the bucket: the base first.
  if (hot.kind == CheckpointKind::kDelta) {
    CKPT_ASSIGN_OR_RETURN(std::optional<CommitMarker> base,
                          ReadCommitMarker(store, prefix, hot.base_step));
    ++stats.requests;
    if (!base.has_value()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "delta step ", step, " cannot be published before its base step ", hot.base_step,
          " (no commit marker for it under s3://", store.bucket(), "/", prefix, ")"));
    }
  }
  // (3) Uploads a dead job left for this step.
  CKPT_ASSIGN_OR_RETURN(std::vector<MultipartUploadInfo> stale,
                        store.ListMultipartUploads(step_keys));
  // Per key the newest is resumed (ISO 8601 times sort as strings), the
  // others aborted.
  std::map<std::string, MultipartUploadInfo> newest;
  for (const MultipartUploadInfo& u : stale) {
    // Another rank's uploads are its own to resume.
    if (!absl::StartsWith(u.key, step_keys) || !selection.Owns(u.key.substr(step_keys.size()))) continue;
    auto [it, fresh] = newest.emplace(u.key, u);
    if (fresh) continue;
    const MultipartUploadInfo& older = u.initiated < it->second.initiated ? u : it->second;
    CKPT_RETURN_IF_ERROR(store.AbortMultipartUpload(older.key, older.upload_id));
    if (&older == &it->second) it->second = u;
  }
  std::map<std::string, std::string> resume;
  for (const auto& [key, u] : newest) resume[key] = u.upload_id;
  // Objects already under the step: a dead job's (tagged by ckpt) are
  // overwritten; anything else was put there by other means and is not ours
  // to replace.
  CKPT_ASSIGN_OR_RETURN(ObjectListing present, store.List(step_keys, ""));
  for (const ObjectInfo& o : present.objects) {
    if (absl::StartsWith(o.key, step_keys) && !selection.Owns(o.key.substr(step_keys.size()))) continue;
    CKPT_ASSIGN_OR_RETURN(ObjectInfo head, store.Head(o.key));
    if (head.metadata.count("ckpt-xxh3") == 0) {
      return absl::AlreadyExistsError(absl::StrCat(
          "s3://", store.bucket(), "/", o.key,
          " exists without a commit marker and was not uploaded by ckpt; not overwriting it"));
    }
  }

  // The local files, hashed.
  CKPT_ASSIGN_OR_RETURN(std::vector<std::string> names, fs->ListDir(hot.dir));
  std::sort(names.begin(), names.end());
  std::vector<LocalFile> files;
  for (const std::string& name : names) {
    if (!selection.Owns(name)) continue;
    LocalFile f;
    f.name = name;
    f.path = internal::JoinPath(hot.dir, name);
    f.key = absl::StrCat(StepPrefix(prefix, step), "/", name);
    CKPT_ASSIGN_OR_RETURN(FileStat st, fs->Stat(f.path));
    if (st.is_directory || st.is_symlink) {
      return absl::UnimplementedError(
          absl::StrCat(f.path, ": only plain files can be published to a bucket"));
    }
    f.bytes = st.size;  // its XXH3: as it is read for upload
    files.push_back(std::move(f));
  }
  Publisher publisher(*fs, store, options);
  publisher.Resume(std::move(resume));
  std::vector<LocalFile*> all;
  for (LocalFile& f : files) all.push_back(&f);

  // (4) Upload, (5) read back what the store's ETags did not confirm (all
  // with `read_back`); what differs goes up once more and is read back.
  auto unconfirmed = publisher.Upload(all);
  if (!unconfirmed.ok()) {
    return Annotate(unconfirmed.status(), absl::StrCat("publishing step ", step, " to ", where));
  }
  const std::vector<LocalFile*>& to_check = options.read_back ? all : *unconfirmed;
  stats.objects_read_back += to_check.size();
  auto bad = publisher.Verify(to_check);
  if (bad.ok() && !bad->empty()) {
    CKPT_RETURN_IF_ERROR(publisher.Upload(*bad).status());
    stats.objects_read_back += bad->size();
    bad = publisher.Verify(*bad);
  }
  if (!bad.ok()) return Annotate(bad.status(), absl::StrCat("reading back step ", step, " from ", where));
  if (!bad->empty()) {
    return absl::DataLossError(absl::StrCat(
        "s3://", store.bucket(), "/", (*bad)[0]->key,
        " does not read back as uploaded (twice); no commit marker written for step ", step));
  }

  for (const LocalFile& f : files) {
    stats.published.push_back(CommitMarker::File{f.name, f.bytes, f.xxh3});
    stats.bytes += f.bytes;
  }
  stats.files = files.size();
  if (!selection.marker()) {  // a rank's part: the marker is CommitPublishedParts'
    stats.requests += publisher.requests();
    stats.parts_resumed = publisher.resumed();
    return stats;
  }

  // (6) The marker, last, over every file of the step.
  std::vector<CommitMarker::File> listed;
  if (selection.published() != nullptr) listed = *selection.published();
  for (const LocalFile& f : files) listed.push_back(CommitMarker::File{f.name, f.bytes, f.xxh3});
  CKPT_RETURN_IF_ERROR(CheckCoversStep(*fs, hot, names, listed, where, options.copy_of));
  CommitMarker marker;
  marker.step = step;
  marker.delta = hot.kind == CheckpointKind::kDelta;
  marker.base_step = marker.delta ? hot.base_step : -1;
  marker.world_size = hot.world_size;
  marker.manifest_xxh3 = hot.manifest_xxh3;
  marker.compacted = hot.compacted;
  marker.compacted_from_manifest_xxh3 = hot.compacted_from_manifest_xxh3;
  std::sort(listed.begin(), listed.end(),
            [](const CommitMarker::File& a, const CommitMarker::File& b) { return a.name < b.name; });
  marker.files = std::move(listed);
  marker.uploaded_by = Identity();
  marker.uploaded_unix_ns = absl::ToUnixNanos(absl::Now());
  const std::string text = SerializeCommitMarker(marker);
  const std::string marker_key = MarkerKey(prefix, step);
  auto put = store.Put(marker_key, text, {!damaged_marker, {}});
  if (!put.ok()) {
    if (!absl::IsAlreadyExists(put.status())) return put.status();
    // Someone's marker (or ours, its response lost): the same checkpoint?
    auto there = ReadCommitMarker(store, prefix, step);
    if (there.ok() && (!there->has_value() || !SameCheckpoint(**there, hot))) {
      return absl::AlreadyExistsError(absl::StrCat(where, " was committed meanwhile with another checkpoint"));
    }
    if (!there.ok() && !absl::IsDataLoss(there.status())) return there.status();
  }
  // The marker too is read back: a store that keeps a damaged body (one
  // that checks no checksum) must not leave the step looking committed but
  // unreadable. Ours, damaged, is written again; twice damaged is kDataLoss.
  for (int attempt = 0;; ++attempt) {
    auto back = store.Get(marker_key);
    stats.requests += 2;
    if (back.ok() && *back == text) break;
    if (back.ok()) {
      auto parsed = ParseCommitMarker(*back, marker_key);
      if (parsed.ok() && SameCheckpoint(*parsed, hot)) break;  // ours, from a lost-response retry
      if (parsed.ok()) {
        return absl::AlreadyExistsError(absl::StrCat(where, " was committed meanwhile with another checkpoint"));
      }
    } else if (!absl::IsNotFound(back.status())) {
      return back.status();
    }
    if (attempt == 1) {
      return absl::DataLossError(absl::StrCat("s3://", store.bucket(), "/", marker_key,
                                              " does not read back as written (twice)"));
    }
    CKPT_RETURN_IF_ERROR(store.Put(marker_key, text, {false, {}}).status());
  }
  stats.requests += publisher.requests();
  stats.parts_resumed = publisher.resumed();
  return stats;
}

}  // namespace

absl::StatusOr<PublishStats> PublishCheckpoint(const std::string& root, int64_t step,
                                               ObjectStore& store, absl::string_view prefix,
                                               const PublishOptions& options) {
  if (options.part.has_value() && *options.part < 0) {
    return absl::InvalidArgumentError(absl::StrCat("PublishOptions::part is ", *options.part));
  }
  if (options.copy_of.has_value() && options.part != options.copy_of) {
    return absl::InvalidArgumentError("PublishOptions::copy_of is set: a rank's copy publishes that rank's part");
  }
  return Publish(root, step, store, prefix, options, Selection{options.part, nullptr});
}

absl::StatusOr<PublishStats> CommitPublishedParts(const std::string& root, int64_t step,
                                                  ObjectStore& store, absl::string_view prefix,
                                                  const std::vector<CommitMarker::File>& published,
                                                  const PublishOptions& options) {
  if (options.part.has_value()) {
    return absl::InvalidArgumentError("CommitPublishedParts publishes no part: PublishOptions::part is set");
  }
  return Publish(root, step, store, prefix, options, Selection{std::nullopt, &published});
}

}  // namespace ckpt
