#include "object/sigv4.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>

#include <algorithm>
#include <ctime>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ckpt::internal {
namespace {

std::string Hex(const unsigned char* data, size_t size) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * size);
  for (size_t i = 0; i < size; ++i) {
    out.push_back(kDigits[data[i] >> 4]);
    out.push_back(kDigits[data[i] & 15]);
  }
  return out;
}

std::string Hmac(absl::string_view key, absl::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), out, &size);
  return std::string(reinterpret_cast<char*>(out), size);
}

// Header values are trimmed and runs of spaces folded to one.
std::string CanonicalValue(absl::string_view value) {
  std::string out;
  bool space = false;
  for (char c : absl::StripAsciiWhitespace(value)) {
    if (c == ' ' || c == '\t') {
      space = true;
      continue;
    }
    if (space) out.push_back(' ');
    space = false;
    out.push_back(c);
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> SortedHeaders(const SigningInput& input) {
  std::vector<std::pair<std::string, std::string>> headers;
  headers.emplace_back("host", input.host);
  for (const auto& [name, value] : input.headers) {
    headers.emplace_back(absl::AsciiStrToLower(name), CanonicalValue(value));
  }
  std::sort(headers.begin(), headers.end());
  return headers;
}

std::string SignedHeaderNames(const std::vector<std::pair<std::string, std::string>>& headers) {
  return absl::StrJoin(headers, ";", [](std::string* out, const auto& h) { out->append(h.first); });
}

}  // namespace

std::string UriEncode(absl::string_view text, bool encode_slash) {
  static constexpr char kDigits[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(text.size());
  for (unsigned char c : text) {
    if (absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' ||
        (c == '/' && !encode_slash)) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kDigits[c >> 4]);
      out.push_back(kDigits[c & 15]);
    }
  }
  return out;
}

std::string CanonicalQueryString(const std::vector<std::pair<std::string, std::string>>& query) {
  std::vector<std::pair<std::string, std::string>> encoded;
  encoded.reserve(query.size());
  for (const auto& [name, value] : query) {
    encoded.emplace_back(UriEncode(name, true), UriEncode(value, true));
  }
  std::sort(encoded.begin(), encoded.end());
  return absl::StrJoin(encoded, "&", [](std::string* out, const auto& p) {
    absl::StrAppend(out, p.first, "=", p.second);
  });
}

std::string Sha256Hex(std::span<const char> data) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), digest);
  return Hex(digest, sizeof(digest));
}

std::string AmzDate(int64_t unix_seconds) {
  const time_t t = static_cast<time_t>(unix_seconds);
  struct tm tm;
  gmtime_r(&t, &tm);
  char buf[32];
  strftime(buf, sizeof(buf), "%Y%m%dT%H%M%SZ", &tm);
  return buf;
}

std::string CanonicalRequest(const SigningInput& input) {
  const auto headers = SortedHeaders(input);
  std::string canonical_headers;
  for (const auto& [name, value] : headers) absl::StrAppend(&canonical_headers, name, ":", value, "\n");
  return absl::StrCat(input.method, "\n", input.path.empty() ? "/" : input.path, "\n",
                      CanonicalQueryString(input.query), "\n", canonical_headers, "\n",
                      SignedHeaderNames(headers), "\n", input.payload_sha256);
}

std::string SignV4(const SigningInput& input, const ObjectCredentials& credentials,
                   absl::string_view region, absl::string_view service,
                   absl::string_view amz_date) {
  const absl::string_view date = amz_date.substr(0, 8);
  const std::string scope = absl::StrCat(date, "/", region, "/", service, "/aws4_request");
  const std::string canonical = CanonicalRequest(input);
  const std::string to_sign = absl::StrCat("AWS4-HMAC-SHA256\n", amz_date, "\n", scope, "\n",
                                           Sha256Hex(canonical));
  std::string key = Hmac(absl::StrCat("AWS4", credentials.secret_access_key), date);
  key = Hmac(key, region);
  key = Hmac(key, service);
  key = Hmac(key, "aws4_request");
  const std::string signature = Hmac(key, to_sign);
  return absl::StrCat("AWS4-HMAC-SHA256 Credential=", credentials.access_key_id, "/", scope,
                      ",SignedHeaders=", SignedHeaderNames(SortedHeaders(input)), ",Signature=",
                      Hex(reinterpret_cast<const unsigned char*>(signature.data()),
                          signature.size()));
}

}  // namespace ckpt::internal
