#include "object/credential_providers.h"

#include <fstream>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
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

}  // namespace

std::optional<absl::Time> ParseIso8601(const std::string& text) {
  absl::Time t;
  std::string err;
  for (const char* format : {"%Y-%m-%dT%H:%M:%E*SZ", "%Y-%m-%dT%H:%M:%E*S%Ez"}) {
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
    auto answer = Body(transport, request, what);
    if (!answer.ok()) return answer.status();
    auto xml = ParseXml(*answer, what);
    if (!xml.ok()) return xml.status();
    const XmlNode* result = xml->Child("AssumeRoleWithWebIdentityResult");
    const XmlNode* creds = result != nullptr ? result->Child("Credentials") : nullptr;
    if (creds == nullptr || creds->ChildText("AccessKeyId").empty()) {
      return absl::DataLossError(absl::StrCat(what, ": no Credentials in the answer"));
    }
    FetchedCredentials f;
    f.credentials.access_key_id = creds->ChildText("AccessKeyId");
    f.credentials.secret_access_key = creds->ChildText("SecretAccessKey");
    f.credentials.session_token = creds->ChildText("SessionToken");
    f.expires = ParseIso8601(creds->ChildText("Expiration"));
    return f;
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
