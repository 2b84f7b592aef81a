// AWS Signature Version 4 for S3 requests, written here rather than left to
// libcurl: Debian 12's curl (7.88) neither canonicalises query strings nor
// hashes streamed bodies, and a signer of our own can be checked against
// AWS's published examples (sigv4_test.cc).
#ifndef CKPT_OBJECT_SIGV4_H_
#define CKPT_OBJECT_SIGV4_H_

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "ckpt/object_store.h"

namespace ckpt::internal {

// What a request is signed over. `headers` are those sent (without Host),
// every one of them signed; `query` holds decoded names and values.
struct SigningInput {
  std::string method;
  std::string host;  // with ":port" when not the scheme's default
  std::string path;  // encoded, as in the URL ("/bucket/key")
  std::vector<std::pair<std::string, std::string>> query;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string payload_sha256;  // hex, or "UNSIGNED-PAYLOAD"
};

// RFC 3986 percent-encoding as SigV4 wants it: unreserved characters
// (A-Z a-z 0-9 - _ . ~) kept, everything else %XX (uppercase); '/' kept
// unless `encode_slash`.
std::string UriEncode(absl::string_view text, bool encode_slash);
// name=value pairs, each encoded, sorted, joined by '&'.
std::string CanonicalQueryString(const std::vector<std::pair<std::string, std::string>>& query);
std::string Sha256Hex(std::span<const char> data);
// "YYYYMMDDTHHMMSSZ".
std::string AmzDate(int64_t unix_seconds);
// The canonical request (exposed for tests and for debugging a refusal).
std::string CanonicalRequest(const SigningInput& input);
// The value of the Authorization header. REQUIRES: `input.headers` holds
// x-amz-date == `amz_date` and x-amz-content-sha256.
std::string SignV4(const SigningInput& input, const ObjectCredentials& credentials,
                   absl::string_view region, absl::string_view service,
                   absl::string_view amz_date);

}  // namespace ckpt::internal

#endif  // CKPT_OBJECT_SIGV4_H_
