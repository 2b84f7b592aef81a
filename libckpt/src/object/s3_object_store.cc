#include "object/s3_object_store.h"

#include <atomic>
#include <chrono>
#include <optional>
#include <cstdlib>
#include <thread>

#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "object/crc32c.h"
#include "object/request_window.h"
#include "object/s3_xml.h"
#include "object/sigv4.h"
#include "util/log.h"
#include "util/mutex.h"
#include "util/status_macros.h"

namespace ckpt::internal {
namespace {

using Params = std::vector<std::pair<std::string, std::string>>;

// Bodies up to this size are signed by their SHA-256; larger ones (parts,
// shard objects) are sent UNSIGNED-PAYLOAD, their integrity carried by the
// CRC32C header the server checks and by ckpt's read-back.
constexpr size_t kSignedPayloadMax = size_t{1} << 20;

struct Call {
  Call(std::string m, std::string k) : method(std::move(m)), key(std::move(k)) {}
  std::string method;
  std::string key;  // empty: the bucket itself
  Params query;
  Params headers;
  std::span<const char> body;
  std::span<char> sink;
  int64_t max_send = 0;
};

std::string HostOf(absl::string_view endpoint) {
  absl::string_view rest = endpoint.substr(endpoint.find("://") + 3);
  return std::string(rest.substr(0, rest.find('/')));
}

class S3ObjectStore final : public ObjectStore {
 public:
  S3ObjectStore(std::string bucket, ResolvedConfig config, const ObjectStoreOptions& options)
      : bucket_(std::move(bucket)), config_(std::move(config)), options_(options) {
    transport_ = options.transport != nullptr ? options.transport
                                              : CurlHttpTransport(config_.ca_bundle);
    scheme_ = config_.endpoint.substr(0, config_.endpoint.find("://"));
    region_ = config_.region;
    host_ = HostOf(config_.endpoint);
    if (!config_.path_style) host_ = absl::StrCat(bucket_, ".", host_);
  }

  // The region requests are signed for and the host they go to.
  std::pair<std::string, std::string> RegionAndHost() {
    internal::MutexLock lock(&where_mu_);
    return {region_, host_};
  }

  // After AWS said the bucket is in `region`: its regional endpoint.
  void MoveToRegion(const std::string& region) {
    internal::MutexLock lock(&where_mu_);
    if (region_ == region) return;
    Log(LogLevel::kInfo, absl::StrCat("s3://", bucket_, " is in ", region, ", not ", region_,
                                      ": using https://s3.", region, ".amazonaws.com (set AWS_REGION to skip this)"));
    region_ = region;
    host_ = absl::StrCat("s3.", region, ".amazonaws.com");
    if (!config_.path_style) host_ = absl::StrCat(bucket_, ".", host_);
  }

  const std::string& bucket() const override { return bucket_; }
  std::string Describe() const override {
    return absl::StrCat("s3://", bucket_, " at ", config_.endpoint);
  }

  absl::StatusOr<std::string> Put(const std::string& key, std::span<const char> data,
                                  const PutObjectOptions& options) override {
    Call call("PUT", key);
    call.body = data;
    call.max_send = options_.max_send_bytes_per_second;
    call.headers.emplace_back("x-amz-checksum-crc32c", Crc32cBase64(Crc32c(data)));
    AddPutHeaders(options, &call.headers);
    auto response = Execute(call, "PutObject");
    if (!response.ok()) return AlreadyExistsOn412(response.status(), key);
    return response->headers["etag"];
  }

  absl::StatusOr<size_t> GetRange(const std::string& key, uint64_t offset,
                                  std::span<char> out) override {
    if (out.empty()) return 0;
    Call call("GET", key);
    call.headers.emplace_back("range",
                              absl::StrCat("bytes=", offset, "-", offset + out.size() - 1));
    call.sink = out;
    auto response = Execute(call, "GetObject");
    if (!response.ok()) {
      // A range starting at or past the end: nothing to read.
      if (absl::StrContains(response.status().message(), "HTTP 416")) return 0;
      return response.status();
    }
    return response->sink_bytes;
  }

  absl::StatusOr<std::string> Get(const std::string& key) override {
    CKPT_ASSIGN_OR_RETURN(HttpResponse response, Execute(Call("GET", key), "GetObject"));
    return std::move(response.body);
  }

  absl::StatusOr<ObjectInfo> Head(const std::string& key) override {
    CKPT_ASSIGN_OR_RETURN(HttpResponse response, Execute(Call("HEAD", key), "HeadObject"));
    ObjectInfo info;
    info.key = key;
    (void)absl::SimpleAtoi(response.headers["content-length"], &info.size);
    info.etag = response.headers["etag"];
    info.storage_class = response.headers["x-amz-storage-class"];
    for (const auto& [name, value] : response.headers) {
      if (absl::StartsWith(name, "x-amz-meta-")) info.metadata[name.substr(11)] = value;
    }
    return info;
  }

  absl::Status Delete(const std::string& key) override {
    auto response = Execute(Call("DELETE", key), "DeleteObject");
    if (!response.ok() && response.status().code() != absl::StatusCode::kNotFound) {
      return response.status();
    }
    return absl::OkStatus();
  }

  absl::StatusOr<ObjectListing> List(const std::string& prefix,
                                     const std::string& delimiter) override {
    ObjectListing listing;
    std::string token;
    for (;;) {
      Call call("GET", "");
      call.query = {{"list-type", "2"},
                    {"prefix", prefix},
                    {"max-keys", absl::StrCat(options_.list_page_size)}};
      if (!delimiter.empty()) call.query.emplace_back("delimiter", delimiter);
      if (!token.empty()) call.query.emplace_back("continuation-token", token);
      CKPT_ASSIGN_OR_RETURN(HttpResponse response, Execute(call, "ListObjectsV2"));
      CKPT_ASSIGN_OR_RETURN(XmlNode xml, ParseXml(response.body, Where("ListObjectsV2", prefix)));
      for (const XmlNode& c : xml.children) {
        if (c.name == "Contents") {
          ObjectInfo info;
          info.key = c.ChildText("Key");
          (void)absl::SimpleAtoi(c.ChildText("Size"), &info.size);
          info.etag = c.ChildText("ETag");
          listing.objects.push_back(std::move(info));
        } else if (c.name == "CommonPrefixes") {
          listing.prefixes.push_back(c.ChildText("Prefix"));
        }
      }
      if (xml.ChildText("IsTruncated") != "true") break;
      token = xml.ChildText("NextContinuationToken");
      if (token.empty()) {
        return absl::DataLossError(absl::StrCat(Where("ListObjectsV2", prefix),
                                                ": truncated listing without a continuation token"));
      }
    }
    return listing;
  }

  absl::StatusOr<std::string> CreateMultipartUpload(const std::string& key,
                                                    const PutObjectOptions& options) override {
    Call call("POST", key);
    call.query = {{"uploads", ""}};
    call.headers.emplace_back("x-amz-checksum-algorithm", "CRC32C");
    AddPutHeaders(PutObjectOptions{false, options.metadata, options.storage_class}, &call.headers);
    CKPT_ASSIGN_OR_RETURN(HttpResponse response, Execute(call, "CreateMultipartUpload"));
    CKPT_ASSIGN_OR_RETURN(XmlNode xml, ParseXml(response.body, Where("CreateMultipartUpload", key)));
    std::string id = xml.ChildText("UploadId");
    if (id.empty()) {
      return absl::DataLossError(absl::StrCat(Where("CreateMultipartUpload", key), ": no UploadId"));
    }
    return id;
  }

  absl::StatusOr<UploadedPart> UploadPart(const std::string& key, const std::string& upload_id,
                                          int part_number, std::span<const char> data) override {
    UploadedPart part;
    part.number = part_number;
    part.crc32c = Crc32cBase64(Crc32c(data));
    Call call("PUT", key);
    call.query = {{"partNumber", absl::StrCat(part_number)}, {"uploadId", upload_id}};
    call.headers.emplace_back("x-amz-checksum-crc32c", part.crc32c);
    call.body = data;
    call.max_send = options_.max_send_bytes_per_second;
    CKPT_ASSIGN_OR_RETURN(HttpResponse response, Execute(call, "UploadPart"));
    part.etag = response.headers["etag"];
    return part;
  }

  absl::StatusOr<std::string> CompleteMultipartUpload(const std::string& key,
                                                      const std::string& upload_id,
                                                      std::span<const UploadedPart> parts,
                                                      bool if_absent) override {
    std::string xml = "<CompleteMultipartUpload>";
    for (const UploadedPart& p : parts) {
      absl::StrAppend(&xml, "<Part><PartNumber>", p.number, "</PartNumber><ETag>",
                      XmlEscape(p.etag), "</ETag>");
      if (!p.crc32c.empty()) absl::StrAppend(&xml, "<ChecksumCRC32C>", p.crc32c, "</ChecksumCRC32C>");
      xml += "</Part>";
    }
    xml += "</CompleteMultipartUpload>";
    Call call("POST", key);
    call.query = {{"uploadId", upload_id}};
    call.body = xml;
    if (if_absent) call.headers.emplace_back("if-none-match", "*");
    auto response = Execute(call, "CompleteMultipartUpload");
    if (!response.ok()) return AlreadyExistsOn412(response.status(), key);
    CKPT_ASSIGN_OR_RETURN(XmlNode result,
                    ParseXml(response->body, Where("CompleteMultipartUpload", key)));
    return result.ChildText("ETag");
  }

  absl::Status AbortMultipartUpload(const std::string& key, const std::string& upload_id) override {
    Call call("DELETE", key);
    call.query = {{"uploadId", upload_id}};
    auto response = Execute(call, "AbortMultipartUpload");
    if (!response.ok() && response.status().code() != absl::StatusCode::kNotFound) {
      return response.status();
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<MultipartUploadInfo>> ListMultipartUploads(
      const std::string& prefix) override {
    std::vector<MultipartUploadInfo> uploads;
    std::string key_marker, id_marker;
    for (;;) {
      Call call("GET", "");
      call.query = {{"uploads", ""}, {"prefix", prefix}};
      if (!key_marker.empty()) call.query.emplace_back("key-marker", key_marker);
      if (!id_marker.empty()) call.query.emplace_back("upload-id-marker", id_marker);
      CKPT_ASSIGN_OR_RETURN(HttpResponse response, Execute(call, "ListMultipartUploads"));
      CKPT_ASSIGN_OR_RETURN(XmlNode xml, ParseXml(response.body, Where("ListMultipartUploads", prefix)));
      for (const XmlNode& c : xml.children) {
        if (c.name != "Upload") continue;
        uploads.push_back(
            MultipartUploadInfo{c.ChildText("Key"), c.ChildText("UploadId"), c.ChildText("Initiated")});
      }
      if (xml.ChildText("IsTruncated") != "true") break;
      key_marker = xml.ChildText("NextKeyMarker");
      id_marker = xml.ChildText("NextUploadIdMarker");
      if (key_marker.empty() && id_marker.empty()) break;
    }
    return uploads;
  }

  absl::StatusOr<std::vector<PartInfo>> ListParts(const std::string& key,
                                                  const std::string& upload_id) override {
    std::vector<PartInfo> parts;
    std::string marker;
    for (;;) {
      Call call("GET", key);
      call.query = {{"uploadId", upload_id}};
      if (!marker.empty()) call.query.emplace_back("part-number-marker", marker);
      CKPT_ASSIGN_OR_RETURN(HttpResponse response, Execute(call, "ListParts"));
      CKPT_ASSIGN_OR_RETURN(XmlNode xml, ParseXml(response.body, Where("ListParts", key)));
      for (const XmlNode& c : xml.children) {
        if (c.name != "Part") continue;
        PartInfo part;
        (void)absl::SimpleAtoi(c.ChildText("PartNumber"), &part.number);
        (void)absl::SimpleAtoi(c.ChildText("Size"), &part.size);
        part.etag = c.ChildText("ETag");
        parts.push_back(std::move(part));
      }
      if (xml.ChildText("IsTruncated") != "true") break;
      const std::string next = xml.ChildText("NextPartNumberMarker");
      if (next.empty() || next == marker) break;
      marker = next;
    }
    return parts;
  }

 private:
  static absl::Status AlreadyExistsOn412(const absl::Status& status, const std::string& key) {
    if (status.code() == absl::StatusCode::kFailedPrecondition) {
      return absl::AlreadyExistsError(status.message());
    }
    return status;
  }

  static void AddPutHeaders(const PutObjectOptions& options, Params* headers) {
    if (options.if_absent) headers->emplace_back("if-none-match", "*");
    if (!options.storage_class.empty()) headers->emplace_back("x-amz-storage-class", options.storage_class);
    for (const auto& [name, value] : options.metadata) {
      headers->emplace_back(absl::StrCat("x-amz-meta-", name), value);
    }
  }

  std::string Where(absl::string_view op, absl::string_view key) const {
    return absl::StrCat("S3 ", op, " s3://", bucket_, "/", key);
  }

  std::string UrlPath(const std::string& key) const {
    std::string path = config_.path_style ? absl::StrCat("/", UriEncode(bucket_, true)) : "";
    if (!key.empty() || path.empty()) absl::StrAppend(&path, "/", UriEncode(key, false));
    return path;
  }

  // One request with retries. A non-2xx response (or a 200 whose body is an
  // <Error>, as S3 may send for CompleteMultipartUpload) is an error naming
  // the operation, bucket, key, HTTP status, S3 code and request id.
  absl::StatusOr<HttpResponse> Execute(const Call& call, absl::string_view op) {
    const std::string path = UrlPath(call.key);
    const std::string query = CanonicalQueryString(call.query);
    HttpRequest request;
    request.method = call.method;
    request.body = call.body;
    request.sink = call.sink;
    request.low_speed_bytes = options_.low_speed_bytes;
    request.low_speed_seconds = options_.low_speed_seconds;
    request.max_send_bytes_per_second = call.max_send;
    const std::string payload = call.body.size() <= kSignedPayloadMax
                                    ? Sha256Hex(call.body)
                                    : std::string("UNSIGNED-PAYLOAD");
    absl::Status last;
    for (int attempt = 0; attempt < std::max(1, options_.max_attempts); ++attempt) {
      if (attempt > 0) Backoff(attempt);
      const int64_t now = (options_.unix_seconds ? options_.unix_seconds()
                                                 : static_cast<int64_t>(time(nullptr))) +
                          skew_seconds_.load();
      const std::string date = AmzDate(now);
      const auto [region, host] = RegionAndHost();
      request.url = absl::StrCat(scheme_, "://", host, path, query.empty() ? "" : "?", query);
      SigningInput signing{call.method, host, path, call.query, call.headers, payload};
      signing.headers.emplace_back("x-amz-date", date);
      signing.headers.emplace_back("x-amz-content-sha256", payload);
      absl::StatusOr<ObjectCredentials> credentials = Credentials();
      if (!credentials.ok()) return credentials.status();
      if (!credentials->session_token.empty()) {
        signing.headers.emplace_back("x-amz-security-token", credentials->session_token);
      }
      request.headers = signing.headers;
      request.headers.emplace_back("authorization",
                                   SignV4(signing, *credentials, region, "s3", date));
      const RequestWindow::Slot slot = window_.Acquire();
      auto response = transport_->Send(request);
      if (!response.ok()) {
        window_.Release(slot, /*throttled=*/false);
        last = absl::UnavailableError(absl::StrCat(Where(op, call.key), ": ",
                                                   response.status().message()));
        if (response.status().code() != absl::StatusCode::kUnavailable) return last;
        continue;
      }
      std::string s3_code, message, body_request_id;
      const bool error_body = absl::StrContains(response->body.substr(0, 512), "<Error>");
      if (response->status < 200 || response->status >= 300 || error_body) {
        auto xml = ParseXml(response->body, "error");
        if (xml.ok()) {
          s3_code = xml->ChildText("Code");
          message = xml->ChildText("Message");
          body_request_id = xml->ChildText("RequestId");  // (where the header is missing)
        }
      }
      window_.Release(slot, IsThrottled(response->status, s3_code));
      if (response->status >= 200 && response->status < 300 && s3_code.empty()) {
        if (!call.sink.empty()) {
          absl::Status whole = CheckRangeComplete(*response, op, call.key);
          if (!whole.ok()) {
            last = whole;
            continue;
          }
        }
        return std::move(*response);
      }
      if (s3_code == "RequestTimeTooSkewed") {
        // Our clock is off: sign by the server's (its Date header) from now on.
        absl::Time server;
        std::string error;
        if (absl::ParseTime("%a, %d %b %Y %H:%M:%S GMT", response->headers["date"], &server, &error)) {
          skew_seconds_ = absl::ToUnixSeconds(server) - (now - skew_seconds_.load());
          Log(LogLevel::kWarning, absl::StrCat("S3 says this clock is off by ", skew_seconds_.load(),
                                               " s; signing by the server's time"));
          last = absl::UnavailableError(absl::StrCat(Where(op, call.key), ": RequestTimeTooSkewed"));
          continue;
        }
      }
      // The bucket lives in another region than we signed for (AWS answers
      // 301 PermanentRedirect, or 400 AuthorizationHeaderMalformed, saying
      // which): sign for it, at its regional endpoint, from now on.
      const std::string bucket_region = response->headers["x-amz-bucket-region"];
      if (config_.aws_endpoint && !bucket_region.empty() && bucket_region != region &&
          (response->status == 301 || response->status == 307 || response->status == 400)) {
        MoveToRegion(bucket_region);
        last = absl::UnavailableError(absl::StrCat(Where(op, call.key), ": the bucket is in ", bucket_region));
        continue;
      }
      const int status = response->status >= 200 && response->status < 300 ? 500 : response->status;
      std::string request_id = response->headers["x-amz-request-id"];
      if (request_id.empty()) request_id = body_request_id;
      last = absl::Status(
          CodeForHttpStatus(status),
          absl::StrCat(Where(op, call.key), ": HTTP ", response->status,
                       s3_code.empty() ? "" : " ", s3_code, message.empty() ? "" : ": ", message,
                       !request_id.empty() ? absl::StrCat(" (request id ", request_id, ")")
                       : s3_code.empty()   ? std::string(" (no S3 error code or request id: is the endpoint an S3 server?)")
                                           : std::string()));
      if (!IsRetryable(status, s3_code)) return last;
    }
    return absl::Status(last.code(), absl::StrCat(last.message(), "; gave up after ",
                                     std::max(1, options_.max_attempts), " attempts"));
  }

  // A ranged GET must deliver every byte its Content-Range promises: a
  // connection cut early is retried, never passed off as the object's end.
  absl::Status CheckRangeComplete(HttpResponse& response, absl::string_view op,
                                  const std::string& key) {
    const std::string& range = response.headers["content-range"];  // bytes a-b/total
    uint64_t first = 0, last = 0;
    std::vector<absl::string_view> parts = absl::StrSplit(range, absl::ByAnyChar(" -/"));
    if (parts.size() == 4 && absl::SimpleAtoi(parts[1], &first) &&
        absl::SimpleAtoi(parts[2], &last) && last >= first) {
      if (response.sink_bytes != last - first + 1) {
        return absl::UnavailableError(absl::StrCat(Where(op, key), ": body of ",
                                                   response.sink_bytes, " bytes for range ", range));
      }
      return absl::OkStatus();
    }
    uint64_t length = 0;
    if (absl::SimpleAtoi(response.headers["content-length"], &length) &&
        response.sink_bytes != length) {
      return absl::UnavailableError(absl::StrCat(Where(op, key), ": body of ", response.sink_bytes,
                                                 " of ", length, " bytes"));
    }
    return absl::OkStatus();
  }

  void Backoff(int attempt) {
    const int64_t cap = std::min<int64_t>(options_.max_backoff_ms,
                                          options_.initial_backoff_ms << std::min(attempt, 20));
    int64_t wait_ms = 0;
    {
      internal::MutexLock lock(&rng_mu_);
      wait_ms = absl::Uniform<int64_t>(rng_, 0, std::max<int64_t>(cap, 1));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms));
  }

  // The credentials to sign with: the configured keys, or fetched ones
  // (`ResolvedConfig::fetch_credentials`), fetched again once less than
  // kRefreshAhead of their life is left. A failed refresh keeps the old ones
  // while they last.
  absl::StatusOr<ObjectCredentials> Credentials() {
    if (!config_.fetch_credentials) return config_.credentials;
    internal::MutexLock lock(&credentials_mu_);
    const absl::Time now = absl::Now();
    if (fetched_.has_value() && (!fetched_->expires.has_value() || *fetched_->expires - now > kRefreshAhead)) {
      return fetched_->credentials;
    }
    auto fresh = config_.fetch_credentials(*transport_);
    if (fresh.ok()) {
      fetched_ = std::move(*fresh);
      return fetched_->credentials;
    }
    if (fetched_.has_value() && *fetched_->expires > now) {
      Log(LogLevel::kWarning, absl::StrCat("S3 credentials from ", config_.credentials_source,
                                           " could not be refreshed (", fresh.status().message(),
                                           "); using the current ones until they expire"));
      return fetched_->credentials;
    }
    return absl::FailedPreconditionError(absl::StrCat("no S3 credentials: ", config_.credentials_source,
                                                      " gave none: ", fresh.status().message(), " (or ",
                                                      config_.no_credentials_hint, ")"));
  }

  static constexpr absl::Duration kRefreshAhead = absl::Minutes(5);
  // More than any caller sends at once (upload streams, restore threads):
  // the window only binds once the store throttled.
  static constexpr int kMaxRequestsInFlight = 64;

  const std::string bucket_;
  const ResolvedConfig config_;
  internal::Mutex credentials_mu_;
  std::optional<FetchedCredentials> fetched_;  // GUARDED_BY(credentials_mu_)
  const ObjectStoreOptions options_;
  std::shared_ptr<HttpTransport> transport_;
  std::string scheme_;
  // Requests in flight, fewer while the store throttles (request_window.h).
  RequestWindow window_{kMaxRequestsInFlight};
  internal::Mutex where_mu_;
  std::string region_, host_;  // GUARDED_BY(where_mu_)
  internal::Mutex rng_mu_;
  absl::BitGen rng_;  // GUARDED_BY(rng_mu_)
  std::atomic<int64_t> skew_seconds_{0};  // server clock minus ours
};

}  // namespace

absl::StatusCode CodeForHttpStatus(int status) {
  switch (status) {
    case 404: return absl::StatusCode::kNotFound;
    case 403: return absl::StatusCode::kPermissionDenied;
    case 412: return absl::StatusCode::kFailedPrecondition;
    case 409: return absl::StatusCode::kAborted;
    case 429: return absl::StatusCode::kUnavailable;
    default: return status >= 500 ? absl::StatusCode::kUnavailable : absl::StatusCode::kInvalidArgument;
  }
}

bool IsThrottled(int status, absl::string_view s3_code) {
  return status == 503 || status == 429 || s3_code == "SlowDown";
}

bool IsRetryable(int status, absl::string_view s3_code) {
  // BadDigest (a body that does not match its x-amz-checksum-* or
  // Content-MD5) and XAmzContentSHA256Mismatch (nor its signed SHA-256): the
  // checksums were computed from the buffer, which still holds the right
  // bytes, so they were damaged on the way and sending them again is right.
  return status >= 500 || status == 429 || s3_code == "SlowDown" || s3_code == "RequestTimeout" ||
         s3_code == "InternalError" || s3_code == "BadDigest" || s3_code == "XAmzContentSHA256Mismatch";
}

std::shared_ptr<ObjectStore> NewS3ObjectStore(std::string bucket, ResolvedConfig config,
                                              const ObjectStoreOptions& options) {
  return std::make_shared<S3ObjectStore>(std::move(bucket), std::move(config), options);
}

}  // namespace ckpt::internal

namespace ckpt {

bool IsObjectUrl(absl::string_view path) { return absl::StartsWith(path, "s3://"); }

absl::StatusOr<ObjectUrl> ParseObjectUrl(absl::string_view url) {
  if (!IsObjectUrl(url)) {
    return absl::InvalidArgumentError(absl::StrCat("\"", url, "\" is not an s3:// URL"));
  }
  absl::string_view rest = url.substr(5);
  const size_t slash = rest.find('/');
  ObjectUrl out;
  out.scheme = "s3";
  out.bucket = std::string(rest.substr(0, slash));
  absl::string_view prefix = slash == absl::string_view::npos ? "" : rest.substr(slash + 1);
  while (absl::EndsWith(prefix, "/")) prefix.remove_suffix(1);
  out.prefix = std::string(prefix);
  bool ok = out.bucket.size() >= 3 && out.bucket.size() <= 63;
  for (char c : out.bucket) {
    ok = ok && ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.');
  }
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        "\"", url, "\": not a valid bucket name (3-63 of a-z, 0-9, '-' and '.')"));
  }
  if (absl::StrContains(out.prefix, "//")) {
    return absl::InvalidArgumentError(absl::StrCat("\"", url, "\": empty path segment"));
  }
  return out;
}

absl::StatusOr<std::shared_ptr<ObjectStore>> OpenObjectStore(absl::string_view url,
                                                             const ObjectStoreOptions& options) {
  auto parsed = ParseObjectUrl(url);
  if (!parsed.ok()) return parsed.status();
  auto config = internal::ResolveConfig(options, [](const char* name) { return getenv(name); });
  if (!config.ok()) return config.status();
  // Credentials to fetch (ResolvedConfig::fetch_credentials) are fetched by
  // the first request, not here: opening a store costs no round trip.
  return internal::NewS3ObjectStore(parsed->bucket, std::move(*config), options);
}

}  // namespace ckpt
