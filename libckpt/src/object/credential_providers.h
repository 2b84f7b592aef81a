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
