// Credentials, region and endpoint, resolved the way the AWS CLI and SDKs
// resolve them (ckpt/object_store.h, `ObjectStoreOptions`).
#ifndef CKPT_OBJECT_CREDENTIALS_H_
#define CKPT_OBJECT_CREDENTIALS_H_

#include <functional>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ckpt/object_store.h"
#include "object/credential_providers.h"

namespace ckpt::internal {

struct ResolvedConfig {
  // Set unless `fetch_credentials` is: the keys configured.
  ObjectCredentials credentials;
  // Where no key is configured: what fetches temporary credentials (a web
  // identity, the profile's role, SSO login or credential_process, the
  // container endpoint, instance metadata; credential_providers.h),
  // which the store calls when it opens and again before they expire, and
  // what to say of all the places looked when that fails.
  CredentialsFetcher fetch_credentials;
  std::string credentials_source;
  std::string no_credentials_hint;
  std::string region;
  std::string endpoint;  // scheme://host[:port], no trailing '/'
  bool aws_endpoint = false;  // AWS's own, chosen by region (no endpoint was set)
  bool path_style = false;
  std::string ca_bundle;
};

// `getenv` for tests.
using EnvLookup = std::function<const char*(const char*)>;

// An INI file's sections: name -> key -> value (keys lowercase). Missing
// file: empty.
std::map<std::string, std::map<std::string, std::string>> ParseIniFile(absl::string_view text);

// kFailedPrecondition (saying where it looked) when no credentials exist:
// none configured and no service to fetch them from (instance metadata is
// one unless AWS_EC2_METADATA_DISABLED=true).
absl::StatusOr<ResolvedConfig> ResolveConfig(const ObjectStoreOptions& options,
                                             const EnvLookup& env);

}  // namespace ckpt::internal

#endif  // CKPT_OBJECT_CREDENTIALS_H_
