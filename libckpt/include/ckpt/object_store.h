// ckpt/object_store.h: an S3-protocol object store, and the HTTP seam under it.
//
//   ckpt::ObjectStoreOptions options;            // credentials etc. from AWS_* / ~/.aws
//   auto store = ckpt::OpenObjectStore("s3://bucket/prefix", options);
//   (*store)->Put("prefix/a", bytes, {});
//
// `ObjectStore` is what the object tier (ckpt/object_tier.h) and the
// read-only file system for `s3://` roots talk to; a second dialect (GCS
// XML, Azure Blob) would implement it too. Every call retries what may
// succeed when tried again (connection errors, stalls, 5xx, 429, SlowDown)
// with exponential backoff and full jitter, and returns an error that names
// the bucket, the key, the HTTP status and the request id.
//
// Under the store, every request goes through one `HttpTransport`: libcurl
// in production, and in tests a transport that faults the Nth request
// (src/testing/fault_injection_transport.h), as `FileSystem` is the seam for
// local I/O.
#ifndef CKPT_OBJECT_STORE_H_
#define CKPT_OBJECT_STORE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ckpt/file_system.h"

namespace ckpt {

// One HTTP request as the store builds it, already signed.
struct HttpRequest {
  std::string method;  // GET, PUT, POST, HEAD, DELETE
  std::string url;     // scheme://host[:port]/path?query, encoded
  std::vector<std::pair<std::string, std::string>> headers;
  std::span<const char> body;
  // GET only: where the response body goes when set (a ranged read lands
  // straight in the caller's buffer); bytes beyond `sink.size()` fail the
  // request. Otherwise the body is collected in `HttpResponse::body`.
  std::span<char> sink;
  // Abort a transfer slower than `low_speed_bytes` per second for
  // `low_speed_seconds` (a stalled connection), and any request that takes
  // longer than `timeout_seconds` in all.
  long low_speed_bytes = 1024;
  long low_speed_seconds = 30;
  long timeout_seconds = 600;
  // Bytes per second this request may send (0: unlimited).
  int64_t max_send_bytes_per_second = 0;
};

struct HttpResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // names lowercase
  std::string body;
  size_t sink_bytes = 0;  // bytes written to `HttpRequest::sink`
};

// Sends requests. A response of any HTTP status is OK here; an error means
// no response was received (connection refused or reset, a stall, a
// timeout): kUnavailable, which the store retries. Thread-safe.
class HttpTransport {
 public:
  virtual ~HttpTransport() = default;
  virtual absl::StatusOr<HttpResponse> Send(const HttpRequest& request) = 0;
};

// libcurl: connections kept alive and reused, proxies from the usual
// environment (`HTTPS_PROXY`, `NO_PROXY`), `ca_bundle` (else the system's)
// for TLS.
std::shared_ptr<HttpTransport> CurlHttpTransport(const std::string& ca_bundle = "");

// `s3://bucket/prefix` split up. `prefix` has no leading or trailing '/'.
struct ObjectUrl {
  std::string scheme;  // "s3"
  std::string bucket;
  std::string prefix;
};
// True for `s3://...` (what `FileSystemForRoot` routes to an object store).
bool IsObjectUrl(absl::string_view path);
// kInvalidArgument naming `url` unless it is `s3://bucket[/prefix]` with a
// valid bucket name.
absl::StatusOr<ObjectUrl> ParseObjectUrl(absl::string_view url);

struct ObjectCredentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  // empty unless temporary credentials
};

struct ObjectStoreOptions {
  // Empty: taken the way the AWS tools take them. Credentials from
  // `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`/`AWS_SESSION_TOKEN`, else the
  // profile (`AWS_PROFILE`, else "default") of `AWS_SHARED_CREDENTIALS_FILE`
  // (~/.aws/credentials) and `AWS_CONFIG_FILE` (~/.aws/config): its keys,
  // its role (`role_arn` + `source_profile`/`credential_source`, assumed at
  // STS), its IAM Identity Center login (`sso_session`), its
  // `credential_process`; where none is
  // set, fetched (and refreshed before they expire) from a web identity
  // (`AWS_WEB_IDENTITY_TOKEN_FILE` + `AWS_ROLE_ARN`, checked before the
  // profile), the container credentials endpoint, or EC2 instance metadata
  // (docs/object-storage.md, "Configuring a bucket"). Region from
  // `AWS_REGION`, `AWS_DEFAULT_REGION`, the profile, else us-east-1.
  // Endpoint from `AWS_ENDPOINT_URL_S3`, `AWS_ENDPOINT_URL`, the profile's
  // `endpoint_url`, else AWS (https://s3.<region>.amazonaws.com).
  std::optional<ObjectCredentials> credentials;
  std::string region;
  std::string endpoint;
  // Path-style URLs (endpoint/bucket/key) instead of virtual-hosted ones
  // (bucket.endpoint/key). Default: path-style for a custom endpoint (MinIO,
  // Ceph, moto), virtual-hosted for AWS.
  std::optional<bool> path_style;
  std::string ca_bundle;  // default `AWS_CA_BUNDLE`
  // Retries: attempts in all per request, and the backoff between them
  // (full jitter: a random wait in [0, min(max, initial * 2^n))).
  int max_attempts = 8;
  int64_t initial_backoff_ms = 100;
  int64_t max_backoff_ms = 20000;
  // A transfer slower than this for this long is aborted and retried.
  long low_speed_bytes = 1024;
  long low_speed_seconds = 30;
  // LIST page size (S3's maximum is 1000; tests use small pages).
  int list_page_size = 1000;
  // Bytes per second each upload may send (0: unlimited).
  int64_t max_send_bytes_per_second = 0;
  // Tests: the transport to send through (default `CurlHttpTransport`), and
  // the clock signatures are dated by (default the system clock).
  std::shared_ptr<HttpTransport> transport;
  std::function<int64_t()> unix_seconds;
};

struct ObjectInfo {
  std::string key;
  uint64_t size = 0;
  std::string etag;
  std::map<std::string, std::string> metadata;  // x-amz-meta-*, names without the prefix
  // `x-amz-storage-class` as HEAD returns it; empty where the store sent
  // none (S3 omits it for STANDARD).
  std::string storage_class;
};

struct ObjectListing {
  std::vector<ObjectInfo> objects;    // keys under the prefix (no deeper than `delimiter`)
  std::vector<std::string> prefixes;  // common prefixes, ending in `delimiter`
};

struct PutObjectOptions {
  // `If-None-Match: *`: the write fails with kAlreadyExists if the key
  // exists (an atomic create; S3 since 2024, MinIO, moto).
  bool if_absent = false;
  // Sent as `x-amz-meta-<name>`.
  std::map<std::string, std::string> metadata;
  // `x-amz-storage-class` (STANDARD_IA, GLACIER_IR, ...); empty: the
  // bucket's default. For a multipart upload, set when it is created.
  std::string storage_class;
};

struct MultipartUploadInfo {
  std::string key;
  std::string upload_id;
  std::string initiated;  // ISO 8601, as the server says
};

// A part the server holds of an unfinished multipart upload.
struct PartInfo {
  int number = 0;
  std::string etag;  // for a part sent without SSE-KMS: the MD5 of its bytes, quoted
  uint64_t size = 0;
};

struct UploadedPart {
  int number = 0;  // 1-based
  std::string etag;
  std::string crc32c;  // base64, as sent
};

class ObjectStore {
 public:
  virtual ~ObjectStore() = default;
  virtual const std::string& bucket() const = 0;
  // What errors and logs call the store ("s3://bucket at endpoint").
  virtual std::string Describe() const = 0;

  // Writes `data` as the whole object `key`, with its CRC32C for the server
  // to check. Returns the ETag. kAlreadyExists with `if_absent` when `key`
  // exists.
  virtual absl::StatusOr<std::string> Put(const std::string& key, std::span<const char> data,
                                          const PutObjectOptions& options) = 0;
  // Reads up to `out.size()` bytes of `key` from `offset` (one ranged GET).
  // Returns how many were read: fewer only at the object's end. kNotFound
  // if there is no `key`.
  virtual absl::StatusOr<size_t> GetRange(const std::string& key, uint64_t offset,
                                          std::span<char> out) = 0;
  // The whole object (for small ones: markers, leases).
  virtual absl::StatusOr<std::string> Get(const std::string& key) = 0;
  // kNotFound if there is no `key`.
  virtual absl::StatusOr<ObjectInfo> Head(const std::string& key) = 0;
  // OK also when `key` did not exist.
  virtual absl::Status Delete(const std::string& key) = 0;
  // Every key under `prefix` (ListObjectsV2, all pages). With a delimiter,
  // keys past it are rolled up into `prefixes`.
  virtual absl::StatusOr<ObjectListing> List(const std::string& prefix,
                                             const std::string& delimiter) = 0;

  // Multipart uploads: create, parts (1-based, each but the last >= 5 MiB on
  // AWS), complete (parts in order; `if_absent` as for `Put`), abort, list.
  virtual absl::StatusOr<std::string> CreateMultipartUpload(const std::string& key,
                                                            const PutObjectOptions& options) = 0;
  virtual absl::StatusOr<UploadedPart> UploadPart(const std::string& key,
                                                  const std::string& upload_id, int part_number,
                                                  std::span<const char> data) = 0;
  virtual absl::StatusOr<std::string> CompleteMultipartUpload(
      const std::string& key, const std::string& upload_id, std::span<const UploadedPart> parts,
      bool if_absent) = 0;
  virtual absl::Status AbortMultipartUpload(const std::string& key,
                                            const std::string& upload_id) = 0;
  virtual absl::StatusOr<std::vector<MultipartUploadInfo>> ListMultipartUploads(
      const std::string& prefix) = 0;
  // The parts the server holds of upload `upload_id` of `key` (all pages):
  // what a resumed upload need not send again.
  virtual absl::StatusOr<std::vector<PartInfo>> ListParts(const std::string& key,
                                                          const std::string& upload_id) = 0;
};

// The S3 dialect for `url`'s bucket (its prefix is the caller's business).
absl::StatusOr<std::shared_ptr<ObjectStore>> OpenObjectStore(absl::string_view url,
                                                             const ObjectStoreOptions& options);

// A read-only `FileSystem` over the committed checkpoints under an `s3://`
// root (ckpt/object_tier.h: a step is visible exactly when its commit marker
// is). Paths are `s3://bucket/prefix/...`. Reads are ranged GETs, many in
// flight through its `IoQueue`; every write (Open for writing, CreateDir,
// Rename, RemoveFile, ...) fails with kUnimplemented saying what to do
// instead.
absl::StatusOr<std::shared_ptr<FileSystem>> ObjectFileSystem(std::shared_ptr<ObjectStore> store);

// The file system that serves `root`: for an `s3://` URL an
// `ObjectFileSystem` over `OpenObjectStore(root, options)`, else `fallback`
// (or `PosixFileSystem()`).
absl::StatusOr<std::shared_ptr<FileSystem>> FileSystemForRoot(
    absl::string_view root, std::shared_ptr<FileSystem> fallback = nullptr,
    const ObjectStoreOptions& options = {});

}  // namespace ckpt

#endif  // CKPT_OBJECT_STORE_H_
