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

namespace ckpt::internal {

struct ResolvedConfig {
  ObjectCredentials credentials;
  std::string region;
  std::string endpoint;  // scheme://host[:port], no trailing '/'
  bool path_style = false;
  std::string ca_bundle;
};

// `getenv` for tests.
using EnvLookup = std::function<const char*(const char*)>;

// An INI file's sections: name -> key -> value (keys lowercase). Missing
// file: empty.
std::map<std::string, std::map<std::string, std::string>> ParseIniFile(absl::string_view text);

// kFailedPrecondition (saying where it looked) when no credentials exist.
absl::StatusOr<ResolvedConfig> ResolveConfig(const ObjectStoreOptions& options,
                                             const EnvLookup& env);

}  // namespace ckpt::internal

#endif  // CKPT_OBJECT_CREDENTIALS_H_
