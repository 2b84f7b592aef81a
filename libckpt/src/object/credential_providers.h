// Credentials fetched from a service, the way the AWS SDKs' default chain
// finds them where no key is configured: a web identity token exchanged at
// STS (EKS IRSA, GitHub OIDC: `AWS_WEB_IDENTITY_TOKEN_FILE` + `AWS_ROLE_ARN`),
// the container credentials endpoint (ECS tasks, EKS Pod Identity:
// `AWS_CONTAINER_CREDENTIALS_FULL_URI` / `_RELATIVE_URI`), and EC2 instance
// metadata (IMDSv2). Each returns temporary credentials and their expiry;
// the store fetches them again before they expire (s3_object_store.cc).
#ifndef CKPT_OBJECT_CREDENTIAL_PROVIDERS_H_
#define CKPT_OBJECT_CREDENTIAL_PROVIDERS_H_

#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "ckpt/object_store.h"

namespace ckpt::internal {

struct FetchedCredentials {
  ObjectCredentials credentials;
  std::optional<absl::Time> expires;  // none: they do not expire
};

// Fetches credentials through the store's transport. Errors say where from.
using CredentialsFetcher = std::function<absl::StatusOr<FetchedCredentials>(HttpTransport&)>;

// STS AssumeRoleWithWebIdentity at `sts_endpoint` (scheme://host[:port]):
// the token is read from `token_file` at every fetch (the platform rotates it).
CredentialsFetcher WebIdentityCredentials(std::string sts_endpoint, std::string role_arn,
                                          std::string session_name, std::string token_file);

// STS AssumeRole for a profile with `role_arn` and `source_profile` or
// `credential_source` (cross-account roles, role chains), signed (SigV4,
// service "sts", `region`) with what `source` gives at each fetch. The
// answer's credentials expire (`duration_seconds`, 0 for STS's default of an
// hour) and are fetched again, from the source's current ones.
struct AssumeRoleRequest {
  std::string sts_endpoint;  // scheme://host[:port]
  std::string region;
  std::string role_arn;
  std::string session_name;
  std::string external_id;  // "" when the role's trust policy asks for none
  int duration_seconds = 0;
};
CredentialsFetcher AssumeRoleCredentials(AssumeRoleRequest request, CredentialsFetcher source);

// IAM Identity Center (SSO) role credentials for a profile with
// `sso_session` (or the older `sso_start_url`), `sso_account_id` and
// `sso_role_name`: the access token `aws sso login` cached in `cache_file`
// (~/.aws/sso/cache/<sha1 of the session name or start URL>.json) is read at
// each fetch, and exchanged at the portal (GetRoleCredentials). An expired or
// missing token is kFailedPrecondition saying to run `login_command`.
// A login of an `sso_session` profile (one with `oidc_endpoint`) is
// refreshable, as the AWS CLI refreshes it: a token with less than 5 minutes
// left is renewed with the cached refreshToken and client registration at
// the OIDC endpoint (CreateToken), and the cache file rewritten (atomically),
// so a job outlives the token's hour.
struct SsoRequest {
  std::string oidc_endpoint;    // https://oidc.<sso_region>.amazonaws.com; "" for the older form
  std::string portal_endpoint;  // https://portal.sso.<sso_region>.amazonaws.com
  std::string cache_file;
  std::string account_id;
  std::string role_name;
  std::string login_command;  // "aws sso login --profile P"
};
CredentialsFetcher SsoCredentials(SsoRequest request);

// The hex SHA-1 of `text` (the SSO token cache's file names).
std::string Sha1Hex(absl::string_view text);

// Fixed keys as a fetcher (they never expire): the source of a role whose
// source_profile has keys, or whose credential_source is Environment.
CredentialsFetcher FixedCredentials(ObjectCredentials credentials);

// GET `url` (with the `Authorization` header `token`, or the contents of
// `token_file`, when either is set) returning the container credentials JSON
// {AccessKeyId, SecretAccessKey, Token, Expiration}.
CredentialsFetcher ContainerCredentials(std::string url, std::string token, std::string token_file);

// IMDSv2 at `endpoint` (default http://169.254.169.254): a session token (PUT
// /latest/api/token), the instance profile's role name, then its
// credentials. Short timeouts: off EC2 it fails within ~2 s.
CredentialsFetcher InstanceMetadataCredentials(std::string endpoint);

// An ISO 8601 time ("2026-12-06T04:00:00Z", fractions allowed), or nullopt.
std::optional<absl::Time> ParseIso8601(const std::string& text);

}  // namespace ckpt::internal

#endif  // CKPT_OBJECT_CREDENTIAL_PROVIDERS_H_
