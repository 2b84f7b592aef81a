// ckpt/object_tier.h: committed checkpoints in an S3-protocol bucket.
//
// Layout under a prefix P (docs/object-storage.md):
//   P/step-<20 digits>/<file>      the checkpoint's files, same names as on disk
//   P/step-<20 digits>.commit      its commit marker, written last
//   P/.ckpt-retain.lease           held by the job tiering into P
// A step is visible (to `ObjectFileSystem`, `ckpt-restore --root s3://`,
// `ckpt.load("s3://")`) exactly when its marker exists. The marker is
// written only after every file was uploaded and found equal to the local
// file -- by the store's ETags (the MD5 of what it received), else read back
// and compared by size and XXH3 -- and only with `If-None-Match: *`; a
// delta's only after its base's.
#ifndef CKPT_OBJECT_TIER_H_
#define CKPT_OBJECT_TIER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "ckpt/file_system.h"
#include "ckpt/object_store.h"

namespace ckpt {

// What a commit marker records: the checkpoint's identity and every file of
// it, so that a reader needs no LIST of the step and no HEAD per file.
struct CommitMarker {
  int64_t step = 0;
  bool delta = false;
  int64_t base_step = -1;       // of a delta
  int world_size = 1;
  uint64_t manifest_xxh3 = 0;   // the manifest's own checksum (ckpt/catalog.h)
  bool compacted = false;       // a compaction of the delta whose manifest had:
  uint64_t compacted_from_manifest_xxh3 = 0;
  struct File {
    std::string name;
    uint64_t bytes = 0;
    uint64_t xxh3 = 0;  // XXH3-64 of the whole file
  };
  std::vector<File> files;
  std::string uploaded_by;  // "host pid N"
  int64_t uploaded_unix_ns = 0;
};

// The marker's bytes: JSON, then a line "xxh3 <16 hex digits>" of the JSON.
std::string SerializeCommitMarker(const CommitMarker& marker);
// kDataLoss naming `what` for a marker that fails its checksum or bounds
// (file names must be plain names; sizes below 2^50; at most 1M files).
absl::StatusOr<CommitMarker> ParseCommitMarker(absl::string_view text, absl::string_view what);

// "P/step-<20 digits>" (P may be empty: then no leading '/').
std::string StepPrefix(absl::string_view prefix, int64_t step);
std::string MarkerKey(absl::string_view prefix, int64_t step);

// The marker of `step` under `prefix`, or nullopt if it has none.
absl::StatusOr<std::optional<CommitMarker>> ReadCommitMarker(ObjectStore& store,
                                                             absl::string_view prefix,
                                                             int64_t step);
// Steps under `prefix` that have a marker, ascending (one paginated LIST).
absl::StatusOr<std::vector<int64_t>> ListCommittedSteps(ObjectStore& store,
                                                        absl::string_view prefix);

struct PublishOptions {
  // Requests in flight at once (uploads, then read-back GETs).
  int streams = 8;
  // Files larger than this go up as a multipart upload of parts this size;
  // it is also the size of one read-back GET. Memory: streams * part_bytes.
  // 8 MiB, as the AWS CLI, boto3 and the AWS CRT use (measured on moto: 16 MiB
  // parts cost the server 1.7x the CPU of 8 MiB ones for the same bytes).
  uint64_t part_bytes = uint64_t{8} << 20;
  // Read every object back after uploading it. Without: only the objects
  // whose ETags are not the MD5 of the bytes sent (computed here) are read
  // back -- the store hashed what it received, so a match proves the bytes
  // arrived whole; a store whose ETags are not MD5s (SSE-KMS, SSE-C) gets
  // every object read back.
  bool read_back = false;
  // The storage class of the step's objects (`x-amz-storage-class`:
  // STANDARD_IA, ONEZONE_IA, INTELLIGENT_TIERING, GLACIER_IR, or a class of
  // another store); empty: the bucket's default. The commit marker (small,
  // read by every listing) and the lease stay in the default class. Classes
  // whose objects cannot be read without a restore request (GLACIER,
  // DEEP_ARCHIVE) are refused: neither the check after the upload nor a
  // restore could read them (`CheckStorageClass`).
  std::string storage_class;
  std::shared_ptr<FileSystem> fs;  // of `root` (null: PosixFileSystem())
  // A multi-rank checkpoint published by its ranks together, each rank its
  // own files: with `part` = r, `PublishCheckpoint` uploads and checks only
  // the files of rank r's part (`rank-<r>.*`) and writes no marker; once
  // every rank's call returned, one process passes what they published to
  // `CommitPublishedParts`. Steps (1)-(3) below then concern rank r's keys
  // only (another rank's uploads are left to it).
  std::optional<int> part;
  // `root` is rank `*copy_of`'s own copy of its steps (ranks that share no
  // ROOT, `DistributedOptions::shared_root = false`): each holds the
  // checkpoint's MANIFEST.json and that rank's files only. `part`, if set,
  // must be the same rank. `CommitPublishedParts` then checks the files the
  // ranks published against the checkpoint's manifest (every rank's
  // manifest listed, no file of a rank the checkpoint does not have) and
  // the local ones against this copy, instead of against one directory that
  // holds them all.
  std::optional<int> copy_of;
};

struct PublishStats {
  bool already_there = false;  // an earlier run had published it: nothing sent
  uint64_t files = 0;
  uint64_t bytes = 0;
  uint64_t requests = 0;  // PUT/POST/GET requests this call made
  // Parts of an interrupted run's multipart upload found on the server with
  // the local bytes' MD5, and so not sent again.
  uint64_t parts_resumed = 0;
  // Objects read back to check them (`PublishOptions::read_back`, or ETags
  // that did not confirm the upload), counting each read of a re-upload.
  uint64_t objects_read_back = 0;
  // Every file this call uploaded and checked (or found under a marker), as
  // the marker lists them: what a rank hands to `CommitPublishedParts`.
  std::vector<CommitMarker::File> published;
};

// OK if `storage_class` may be given as `PublishOptions::storage_class`:
// empty, or an S3 storage class name (upper-case letters, digits, `_`) whose
// objects are readable at once; kInvalidArgument naming the problem else.
absl::Status CheckStorageClass(absl::string_view storage_class);

// Publishes committed checkpoint `step` of the local `root` under `prefix`:
// (1) if a marker exists: the same checkpoint (its manifest checksum, or a
// compaction of it) is OK with `already_there`; another is kAlreadyExists;
// (2) a delta's base must have a marker (else kFailedPrecondition);
// (3) of the multipart uploads an interrupted run left under the step, the
// newest of each file is resumed -- its parts whose size and ETag (MD5) match
// the local bytes are kept, not sent again -- and the others aborted;
// (4) every file is uploaded (multipart above `part_bytes`), `streams` at a
// time, each with its CRC32C for the server to check, and hashed (XXH3) from
// the buffers it is sent from: each file is read once;
// (5) every object whose ETags are not the MD5s of the bytes sent (every
// object, with `read_back`) is read back and compared with the local file
// (size and XXH3); one that differs is uploaded and read back once more, then
// kDataLoss naming the key;
// (6) the marker is written with `If-None-Match: *`; if one appeared
// meanwhile (or our write's response was lost), it is read: ours is OK,
// another is kAlreadyExists.
// On any failure no marker exists for the step (the objects uploaded so far
// are invisible, and the next call overwrites them). REQUIRES: the caller
// holds the prefix's lease (`ObjectLease`), so no one else writes the step.
absl::StatusOr<PublishStats> PublishCheckpoint(const std::string& root, int64_t step,
                                               ObjectStore& store, absl::string_view prefix,
                                               const PublishOptions& options);

// Commits a multi-rank checkpoint whose ranks published their parts
// (`PublishOptions::part`; `published`: the concatenation of their
// `PublishStats::published`): uploads and checks the step's other files (its
// global manifest), then writes the marker as `PublishCheckpoint` does,
// listing every file -- only if the files listed and uploaded are exactly
// the local step directory's, with their sizes (else kFailedPrecondition
// naming the file, and no marker). A marker already there for the same
// checkpoint is OK (`already_there`). REQUIRES: the lease, held since before
// the parts were published.
absl::StatusOr<PublishStats> CommitPublishedParts(const std::string& root, int64_t step,
                                                  ObjectStore& store, absl::string_view prefix,
                                                  const std::vector<CommitMarker::File>& published,
                                                  const PublishOptions& options);

// Removes what dead jobs left under `prefix`: multipart uploads of keys under
// `P/step-*/` -- of committed steps all, of others those initiated more than
// `stale_upload_age` ago (younger ones a rerun resumes) -- and objects of
// steps without a marker that carry ckpt's upload metadata
// (`x-amz-meta-ckpt-xxh3`) -- never anything uploaded by other means.
struct ObjectReclaimStats {
  uint64_t uploads_aborted = 0;
  uint64_t objects_deleted = 0;
};
absl::StatusOr<ObjectReclaimStats> ReclaimObjectOrphans(
    ObjectStore& store, absl::string_view prefix,
    absl::Duration stale_upload_age = absl::Hours(24));

// One job at a time per prefix, as flock does for a directory: the lease is
// the object `P/.ckpt-retain.lease`, created with `If-None-Match: *` and
// holding who took it and until when. A lease past its expiry is taken over
// (a job that died). While held it is renewed (a thread rewrites it with
// `duration` more every `duration` / 3, as long as it is still ours), so a
// job longer than `duration` keeps it; a live job's lease never expires.
// Deleted when this object is destroyed.
//
// A store that ignores `If-None-Match: *` (older Ceph and MinIO releases)
// would let two jobs hold the lease at once. So a lease just created is
// created once more, conditionally: a store that honours the condition
// refuses (412), one that does not accepts it, and then Acquire releases the
// lease and fails with kFailedPrecondition saying so -- unless the
// environment sets CKPT_S3_UNCONDITIONAL_LEASE=1 (the operator keeps jobs
// apart by other means), which makes it a warning.
class ObjectLease {
 public:
  // kUnavailable naming the holder and its expiry while another job holds it
  // (`IsLeaseHeld` tells that error from a request that failed).
  static absl::StatusOr<std::unique_ptr<ObjectLease>> Acquire(std::shared_ptr<ObjectStore> store,
                                                              absl::string_view prefix,
                                                              absl::string_view owner,
                                                              absl::Duration duration);
  // `Acquire`, waiting while another job holds the lease: tried again after
  // 1 s, then at growing intervals up to 10 s, for `wait` at most (what an
  // upload behind the save does while a `ckpt-retain` run tiers into the
  // same prefix). `cancelled` (may be empty), polled every 100 ms, ends the
  // wait with kCancelled. After `wait`, the held error, saying how long it
  // waited (still `IsLeaseHeld`). Other errors are returned at once.
  static absl::StatusOr<std::unique_ptr<ObjectLease>> AcquireWaiting(
      std::shared_ptr<ObjectStore> store, absl::string_view prefix, absl::string_view owner,
      absl::Duration duration, absl::Duration wait, const std::function<bool()>& cancelled = {});
  ~ObjectLease();
  const std::string& key() const { return key_; }
  // How many times it was renewed so far.
  int renewals() const;

 private:
  class Renewer;
  ObjectLease(std::shared_ptr<ObjectStore> store, std::string key, std::string owner, std::string nonce,
              std::string body, absl::Duration duration);
  std::shared_ptr<ObjectStore> store_;
  std::string key_;
  std::unique_ptr<Renewer> renewer_;  // owns the current body
};

// Whether `status` is `ObjectLease::Acquire`'s "another job holds the lease".
bool IsLeaseHeld(const absl::Status& status);

}  // namespace ckpt

#endif  // CKPT_OBJECT_TIER_H_
