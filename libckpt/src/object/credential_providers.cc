#include "object/credential_providers.h"

#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <fstream>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>
#include <openssl/sha.h>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "object/s3_xml.h"
#include "object/sigv4.h"

namespace ckpt::internal {
namespace {

absl::StatusOr<std::string> ReadToken(const std::string& path, absl::string_view what) {
  std::ifstream in(path);
  if (!in) return absl::FailedPreconditionError(absl::StrCat(what, ": cannot read ", path));
  std::stringstream s;
  s << in.rdbuf();
  std::string token(absl::StripAsciiWhitespace(s.str()));
  if (token.empty()) return absl::FailedPreconditionError(absl::StrCat(what, ": ", path, " is empty"));
  return token;
}

// A request with short timeouts: these endpoints answer at once or not at all.
HttpRequest Quick(std::string method, std::string url) {
  HttpRequest r;
  r.method = std::move(method);
  r.url = std::move(url);
  r.timeout_seconds = 5;
  r.low_speed_seconds = 5;
  return r;
}

// A 2xx response's body; else an error naming `what` and the status.
absl::StatusOr<std::string> Body(HttpTransport& transport, const HttpRequest& request, absl::string_view what) {
  auto response = transport.Send(request);
  if (!response.ok()) {
    return absl::UnavailableError(absl::StrCat(what, " (", request.url, "): ", response.status().message()));
  }
  if (response->status < 200 || response->status > 299) {
    return absl::PermissionDeniedError(absl::StrCat(what, " (", request.url, "): HTTP ", response->status, ": ",
                                                    response->body.substr(0, 300)));
  }
  return std::move(response->body);
}

// {AccessKeyId, SecretAccessKey, Token, Expiration} (container endpoint, IMDS).
absl::StatusOr<FetchedCredentials> ParseCredentialsJson(const std::string& body, absl::string_view what) {
  nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
  if (!j.is_object() || !j.contains("AccessKeyId") || !j.contains("SecretAccessKey") ||
      !j["AccessKeyId"].is_string() || !j["SecretAccessKey"].is_string()) {
    return absl::DataLossError(absl::StrCat(what, " did not answer {\"AccessKeyId\", \"SecretAccessKey\", ...}"));
  }
  FetchedCredentials f;
  f.credentials.access_key_id = j["AccessKeyId"].get<std::string>();
  f.credentials.secret_access_key = j["SecretAccessKey"].get<std::string>();
  if (j.contains("Token") && j["Token"].is_string()) f.credentials.session_token = j["Token"].get<std::string>();
  if (j.contains("Expiration") && j["Expiration"].is_string()) {
    f.expires = ParseIso8601(j["Expiration"].get<std::string>());
  }
  return f;
}

// Sends an STS request and takes the credentials out of its answer's
// <`result`><Credentials> (AssumeRole and AssumeRoleWithWebIdentity answer
// alike).
absl::StatusOr<FetchedCredentials> StsCredentials(HttpTransport& transport, const HttpRequest& request,
                                                  absl::string_view result, absl::string_view what) {
  auto answer = Body(transport, request, what);
  if (!answer.ok()) return answer.status();
  auto xml = ParseXml(*answer, what);
  if (!xml.ok()) return xml.status();
  const XmlNode* node = xml->Child(result);
  const XmlNode* creds = node != nullptr ? node->Child("Credentials") : nullptr;
  if (creds == nullptr || creds->ChildText("AccessKeyId").empty()) {
    return absl::DataLossError(absl::StrCat(what, ": no Credentials in the answer"));
  }
  FetchedCredentials f;
  f.credentials.access_key_id = creds->ChildText("AccessKeyId");
  f.credentials.secret_access_key = creds->ChildText("SecretAccessKey");
  f.credentials.session_token = creds->ChildText("SessionToken");
  f.expires = ParseIso8601(creds->ChildText("Expiration"));
  return f;
}

}  // namespace

std::optional<absl::Time> ParseIso8601(const std::string& text) {
  absl::Time t;
  std::string err;
  // The last: older AWS CLIs' SSO token cache ("2026-12-07T12:00:00UTC").
  for (const char* format : {"%Y-%m-%dT%H:%M:%E*SZ", "%Y-%m-%dT%H:%M:%E*S%Ez", "%Y-%m-%dT%H:%M:%E*SUTC"}) {
    if (absl::ParseTime(format, text, &t, &err)) return t;
  }
  return std::nullopt;
}

CredentialsFetcher WebIdentityCredentials(std::string sts_endpoint, std::string role_arn,
                                          std::string session_name, std::string token_file) {
  return [=](HttpTransport& transport) -> absl::StatusOr<FetchedCredentials> {
    const std::string what = absl::StrCat("web identity credentials (STS AssumeRoleWithWebIdentity for ",
                                          role_arn, ")");
    auto token = ReadToken(token_file, what);
    if (!token.ok()) return token.status();
    // Unsigned: the token is the proof. A form body, as the SDKs send it.
    const std::string body = absl::StrCat(
        "Action=AssumeRoleWithWebIdentity&Version=2011-06-15&RoleArn=", UriEncode(role_arn, true),
        "&RoleSessionName=", UriEncode(session_name, true), "&WebIdentityToken=", UriEncode(*token, true));
    HttpRequest request = Quick("POST", absl::StrCat(sts_endpoint, "/"));
    request.headers = {{"content-type", "application/x-www-form-urlencoded; charset=utf-8"},
                       {"accept", "application/xml"}};
    request.body = std::span<const char>(body.data(), body.size());
    request.timeout_seconds = 30;
    return StsCredentials(transport, request, "AssumeRoleWithWebIdentityResult", what);
  };
}

CredentialsFetcher AssumeRoleCredentials(AssumeRoleRequest request, CredentialsFetcher source) {
  return [request = std::move(request), source = std::move(source)](
             HttpTransport& transport) -> absl::StatusOr<FetchedCredentials> {
    const std::string what = absl::StrCat("role credentials (STS AssumeRole for ", request.role_arn, ")");
    auto from = source(transport);
    if (!from.ok()) {
      return absl::Status(from.status().code(),
                          absl::StrCat(what, ": its source credentials: ", from.status().message()));
    }
    std::string body = absl::StrCat("Action=AssumeRole&Version=2011-06-15&RoleArn=",
                                    UriEncode(request.role_arn, true),
                                    "&RoleSessionName=", UriEncode(request.session_name, true));
    if (!request.external_id.empty()) {
      absl::StrAppend(&body, "&ExternalId=", UriEncode(request.external_id, true));
    }
    if (request.duration_seconds > 0) absl::StrAppend(&body, "&DurationSeconds=", request.duration_seconds);
    const size_t scheme_end = request.sts_endpoint.find("://");
    const std::string host =
        scheme_end == std::string::npos ? request.sts_endpoint : request.sts_endpoint.substr(scheme_end + 3);
    const std::string date = AmzDate(static_cast<int64_t>(time(nullptr)));
    const std::string payload = Sha256Hex(std::span<const char>(body.data(), body.size()));
    SigningInput signing{"POST", host, "/", {}, {}, payload};
    signing.headers = {{"content-type", "application/x-www-form-urlencoded; charset=utf-8"},
                       {"x-amz-date", date},
                       {"x-amz-content-sha256", payload}};
    if (!from->credentials.session_token.empty()) {
      signing.headers.emplace_back("x-amz-security-token", from->credentials.session_token);
    }
    HttpRequest http = Quick("POST", absl::StrCat(request.sts_endpoint, "/"));
    http.headers = signing.headers;
    http.headers.emplace_back("accept", "application/xml");
    http.headers.emplace_back("authorization", SignV4(signing, from->credentials, request.region, "sts", date));
    http.body = std::span<const char>(body.data(), body.size());
    http.timeout_seconds = 30;
    return StsCredentials(transport, http, "AssumeRoleResult", what);
  };
}

std::string Sha1Hex(absl::string_view text) {
  unsigned char digest[SHA_DIGEST_LENGTH];
  SHA1(reinterpret_cast<const unsigned char*>(text.data()), text.size(), digest);
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(digest), sizeof(digest)));
}

namespace {

// The cached SSO login `cached` renewed at `request.oidc_endpoint` (CreateToken
// with its refreshToken and client registration) and written back to the
// cache file; the new access token.
absl::StatusOr<std::string> RefreshSsoToken(HttpTransport& transport, const SsoRequest& request,
                                            nlohmann::json cached, absl::string_view what) {
  for (const char* field : {"refreshToken", "clientId", "clientSecret"}) {
    if (!cached.contains(field) || !cached[field].is_string()) {
      return absl::FailedPreconditionError(absl::StrCat(what, ": the cached login has no ", field,
                                                        " to renew it with"));
    }
  }
  if (cached.contains("registrationExpiresAt") && cached["registrationExpiresAt"].is_string()) {
    std::optional<absl::Time> registration = ParseIso8601(cached["registrationExpiresAt"].get<std::string>());
    if (registration.has_value() && *registration <= absl::Now()) {
      return absl::FailedPreconditionError(absl::StrCat(what, ": the cached client registration expired"));
    }
  }
  nlohmann::json ask = {{"grantType", "refresh_token"},
                        {"clientId", cached["clientId"]},
                        {"clientSecret", cached["clientSecret"]},
                        {"refreshToken", cached["refreshToken"]}};
  const std::string body = ask.dump();
  HttpRequest http = Quick("POST", absl::StrCat(request.oidc_endpoint, "/token"));
  http.headers = {{"content-type", "application/json"}};
  http.body = std::span<const char>(body.data(), body.size());
  http.timeout_seconds = 30;
  auto answer = Body(transport, http, absl::StrCat(what, ", renewing the SSO login"));
  if (!answer.ok()) return answer.status();
  nlohmann::json got = nlohmann::json::parse(*answer, nullptr, false);
  if (!got.is_object() || !got.contains("accessToken") || !got["accessToken"].is_string() ||
      !got.contains("expiresIn") || !got["expiresIn"].is_number_integer()) {
    return absl::DataLossError(absl::StrCat(what, ": the OIDC endpoint answered no accessToken and expiresIn"));
  }
  cached["accessToken"] = got["accessToken"];
  cached["expiresAt"] = absl::FormatTime("%Y-%m-%dT%H:%M:%SZ",
                                         absl::Now() + absl::Seconds(got["expiresIn"].get<int64_t>()),
                                         absl::UTCTimeZone());
  if (got.contains("refreshToken") && got["refreshToken"].is_string()) cached["refreshToken"] = got["refreshToken"];
  // Written back whole, then renamed over the old one, as the AWS CLI does:
  // the next fetch, and the user's own aws commands, use the renewed login.
  const std::string temp = absl::StrCat(request.cache_file, ".ckpt-", getpid());
  {
    std::ofstream out(temp, std::ios::trunc);
    out << cached.dump();
    if (!out.flush()) {
      std::remove(temp.c_str());
      return absl::FailedPreconditionError(absl::StrCat(what, ": cannot write ", temp));
    }
  }
  if (std::rename(temp.c_str(), request.cache_file.c_str()) != 0) {
    std::remove(temp.c_str());
    return absl::FailedPreconditionError(absl::StrCat(what, ": cannot replace ", request.cache_file));
  }
  return got["accessToken"].get<std::string>();
}

}  // namespace

CredentialsFetcher SsoCredentials(SsoRequest request) {
  return [request = std::move(request)](HttpTransport& transport) -> absl::StatusOr<FetchedCredentials> {
    const std::string what = absl::StrCat("SSO credentials (role ", request.role_name, " in account ",
                                          request.account_id, ")");
    const std::string login = absl::StrCat("run `", request.login_command, "` and try again");
    std::ifstream in(request.cache_file);
    if (!in) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, ": no SSO login cached (", request.cache_file, " is missing): ", login));
    }
    std::stringstream text;
    text << in.rdbuf();
    nlohmann::json cached = nlohmann::json::parse(text.str(), nullptr, false);
    if (!cached.is_object() || !cached.contains("accessToken") || !cached["accessToken"].is_string()) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, ": ", request.cache_file, " holds no accessToken: ", login));
    }
    const std::string expires_at =
        cached.contains("expiresAt") && cached["expiresAt"].is_string() ? cached["expiresAt"].get<std::string>() : "";
    std::optional<absl::Time> token_expires = ParseIso8601(expires_at);
    const bool valid = token_expires.has_value() && *token_expires > absl::Now();
    std::string token = cached["accessToken"].get<std::string>();
    if (!request.oidc_endpoint.empty() && (!valid || *token_expires - absl::Now() < absl::Minutes(5))) {
      auto renewed = RefreshSsoToken(transport, request, cached, what);
      if (renewed.ok()) {
        token = *std::move(renewed);
      } else if (!valid) {
        return absl::FailedPreconditionError(absl::StrCat(what, ": the SSO login cached in ", request.cache_file,
                                                          " expired (expiresAt ", expires_at,
                                                          ") and could not be renewed (", renewed.status().message(),
                                                          "): ", login));
      }
    } else if (!valid) {
      return absl::FailedPreconditionError(absl::StrCat(what, ": the SSO login cached in ", request.cache_file,
                                                        " expired (expiresAt ", expires_at, "): ", login));
    }
    HttpRequest http = Quick("GET", absl::StrCat(request.portal_endpoint, "/federation/credentials?account_id=",
                                                 UriEncode(request.account_id, true),
                                                 "&role_name=", UriEncode(request.role_name, true)));
    http.headers = {{"x-amz-sso_bearer_token", token}};
    http.timeout_seconds = 30;
    auto answer = Body(transport, http, what);
    if (!answer.ok()) return answer.status();
    nlohmann::json j = nlohmann::json::parse(*answer, nullptr, false);
    const nlohmann::json* role = j.is_object() && j.contains("roleCredentials") ? &j["roleCredentials"] : nullptr;
    if (role == nullptr || !role->is_object() || !role->contains("accessKeyId") ||
        !(*role)["accessKeyId"].is_string() || !role->contains("secretAccessKey") ||
        !(*role)["secretAccessKey"].is_string()) {
      return absl::DataLossError(absl::StrCat(what, ": no roleCredentials in the portal's answer"));
    }
    FetchedCredentials f;
    f.credentials.access_key_id = (*role)["accessKeyId"].get<std::string>();
    f.credentials.secret_access_key = (*role)["secretAccessKey"].get<std::string>();
    if (role->contains("sessionToken") && (*role)["sessionToken"].is_string()) {
      f.credentials.session_token = (*role)["sessionToken"].get<std::string>();
    }
    if (role->contains("expiration") && (*role)["expiration"].is_number_integer()) {
      f.expires = absl::FromUnixMillis((*role)["expiration"].get<int64_t>());  // milliseconds
    }
    return f;
  };
}

CredentialsFetcher FixedCredentials(ObjectCredentials credentials) {
  return [credentials = std::move(credentials)](HttpTransport&) -> absl::StatusOr<FetchedCredentials> {
    return FetchedCredentials{credentials, std::nullopt};
  };
}

CredentialsFetcher ContainerCredentials(std::string url, std::string token, std::string token_file) {
  return [=](HttpTransport& transport) -> absl::StatusOr<FetchedCredentials> {
    const std::string what = "container credentials";
    HttpRequest request = Quick("GET", url);
    std::string auth = token;
    if (!token_file.empty()) {
      auto read = ReadToken(token_file, what);
      if (!read.ok()) return read.status();
      auth = *read;
    }
    if (!auth.empty()) request.headers.emplace_back("authorization", auth);
    auto answer = Body(transport, request, what);
    if (!answer.ok()) return answer.status();
    return ParseCredentialsJson(*answer, absl::StrCat(what, " (", url, ")"));
  };
}

CredentialsFetcher InstanceMetadataCredentials(std::string endpoint) {
  while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
  return [=](HttpTransport& transport) -> absl::StatusOr<FetchedCredentials> {
    const std::string what = absl::StrCat("EC2 instance metadata (", endpoint, ")");
    HttpRequest put = Quick("PUT", absl::StrCat(endpoint, "/latest/api/token"));
    put.headers = {{"x-aws-ec2-metadata-token-ttl-seconds", "21600"}};
    put.timeout_seconds = 2;
    auto session = Body(transport, put, absl::StrCat(what, ", session token"));
    if (!session.ok()) return session.status();
    const std::string base = absl::StrCat(endpoint, "/latest/meta-data/iam/security-credentials/");
    HttpRequest list = Quick("GET", base);
    list.headers = {{"x-aws-ec2-metadata-token", *session}};
    auto roles = Body(transport, list, absl::StrCat(what, ", instance profile"));
    if (!roles.ok()) return roles.status();
    std::string role(absl::StripAsciiWhitespace(*roles));
    role = role.substr(0, role.find('\n'));
    if (role.empty()) return absl::FailedPreconditionError(absl::StrCat(what, ": the instance has no role"));
    HttpRequest get = Quick("GET", base + role);
    get.headers = list.headers;
    auto answer = Body(transport, get, absl::StrCat(what, ", role ", role));
    if (!answer.ok()) return answer.status();
    return ParseCredentialsJson(*answer, absl::StrCat(what, ", role ", role));
  };
}

}  // namespace ckpt::internal
