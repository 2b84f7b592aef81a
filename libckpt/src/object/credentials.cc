#include "object/credentials.h"

#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace ckpt::internal {
namespace {

std::string Env(const EnvLookup& env, const char* name) {
  const char* v = env(name);
  return v != nullptr ? std::string(v) : std::string();
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  if (!in) return "";
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string Lookup(const std::map<std::string, std::map<std::string, std::string>>& ini,
                   const std::string& section, const std::string& key) {
  auto s = ini.find(section);
  if (s == ini.end()) return "";
  auto k = s->second.find(key);
  return k != s->second.end() ? k->second : "";
}

// Runs the profile's `credential_process` (how the AWS tools reach SSO,
// IRSA helpers, vaults: `aws configure export-credentials --format process`)
// and parses its JSON: Version 1, AccessKeyId, SecretAccessKey, SessionToken.
absl::StatusOr<ObjectCredentials> RunCredentialProcess(const std::string& command) {
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("credential_process \"", command, "\": cannot run it"));
  }
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0 && out.size() < (1 << 20)) out.append(buf, n);
  const int rc = pclose(pipe);
  if (rc != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("credential_process \"", command, "\" exited with status ", rc));
  }
  nlohmann::json j = nlohmann::json::parse(out, nullptr, false);
  if (!j.is_object() || j.value("Version", 0) != 1 || !j.contains("AccessKeyId") ||
      !j.contains("SecretAccessKey")) {
    return absl::FailedPreconditionError(absl::StrCat(
        "credential_process \"", command,
        "\" did not print {\"Version\": 1, \"AccessKeyId\": ..., \"SecretAccessKey\": ...}"));
  }
  ObjectCredentials c;
  c.access_key_id = j.value("AccessKeyId", "");
  c.secret_access_key = j.value("SecretAccessKey", "");
  c.session_token = j.value("SessionToken", "");
  return c;
}

}  // namespace

std::map<std::string, std::map<std::string, std::string>> ParseIniFile(absl::string_view text) {
  std::map<std::string, std::map<std::string, std::string>> out;
  std::string section;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    if (line.front() == '[' && line.back() == ']') {
      section = std::string(absl::StripAsciiWhitespace(line.substr(1, line.size() - 2)));
      continue;
    }
    const size_t eq = line.find('=');
    if (eq == absl::string_view::npos || section.empty()) continue;
    out[section][absl::AsciiStrToLower(absl::StripAsciiWhitespace(line.substr(0, eq)))] =
        std::string(absl::StripAsciiWhitespace(line.substr(eq + 1)));
  }
  return out;
}

absl::StatusOr<ResolvedConfig> ResolveConfig(const ObjectStoreOptions& options,
                                             const EnvLookup& env) {
  ResolvedConfig c;
  const std::string home = Env(env, "HOME");
  std::string profile = Env(env, "AWS_PROFILE");
  if (profile.empty()) profile = "default";
  std::string credentials_file = Env(env, "AWS_SHARED_CREDENTIALS_FILE");
  if (credentials_file.empty()) credentials_file = absl::StrCat(home, "/.aws/credentials");
  std::string config_file = Env(env, "AWS_CONFIG_FILE");
  if (config_file.empty()) config_file = absl::StrCat(home, "/.aws/config");
  const auto creds_ini = ParseIniFile(ReadText(credentials_file));
  const auto config_ini = ParseIniFile(ReadText(config_file));
  // In the config file, profiles other than "default" are "[profile name]".
  const std::string config_section =
      profile == "default" ? std::string("default") : absl::StrCat("profile ", profile);
  auto profile_value = [&](const std::string& key) {
    std::string v = Lookup(creds_ini, profile, key);
    if (v.empty()) v = Lookup(config_ini, config_section, key);
    return v;
  };

  if (options.credentials.has_value()) {
    c.credentials = *options.credentials;
  } else if (!Env(env, "AWS_ACCESS_KEY_ID").empty()) {
    c.credentials.access_key_id = Env(env, "AWS_ACCESS_KEY_ID");
    c.credentials.secret_access_key = Env(env, "AWS_SECRET_ACCESS_KEY");
    c.credentials.session_token = Env(env, "AWS_SESSION_TOKEN");
  } else {
    c.credentials.access_key_id = profile_value("aws_access_key_id");
    c.credentials.secret_access_key = profile_value("aws_secret_access_key");
    c.credentials.session_token = profile_value("aws_session_token");
    const std::string process = profile_value("credential_process");
    if (c.credentials.access_key_id.empty() && !process.empty()) {
      auto got = RunCredentialProcess(process);
      if (!got.ok()) return got.status();
      c.credentials = *got;
    }
  }
  if (c.credentials.access_key_id.empty() || c.credentials.secret_access_key.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or profile \"",
        profile, "\" in ", credentials_file, " or ", config_file));
  }

  c.region = options.region;
  if (c.region.empty()) c.region = Env(env, "AWS_REGION");
  if (c.region.empty()) c.region = Env(env, "AWS_DEFAULT_REGION");
  if (c.region.empty()) c.region = Lookup(config_ini, config_section, "region");
  if (c.region.empty()) c.region = "us-east-1";

  c.endpoint = options.endpoint;
  if (c.endpoint.empty()) c.endpoint = Env(env, "AWS_ENDPOINT_URL_S3");
  if (c.endpoint.empty()) c.endpoint = Env(env, "AWS_ENDPOINT_URL");
  if (c.endpoint.empty()) c.endpoint = Lookup(config_ini, config_section, "endpoint_url");
  const bool custom = !c.endpoint.empty();
  if (!custom) c.endpoint = absl::StrCat("https://s3.", c.region, ".amazonaws.com");
  while (absl::EndsWith(c.endpoint, "/")) c.endpoint.pop_back();
  if (!absl::StartsWith(c.endpoint, "http://") && !absl::StartsWith(c.endpoint, "https://")) {
    return absl::InvalidArgumentError(
        absl::StrCat("S3 endpoint \"", c.endpoint, "\" must start with http:// or https://"));
  }
  c.path_style = options.path_style.value_or(custom);

  c.ca_bundle = options.ca_bundle;
  if (c.ca_bundle.empty()) c.ca_bundle = Env(env, "AWS_CA_BUNDLE");
  if (c.ca_bundle.empty()) c.ca_bundle = Lookup(config_ini, config_section, "ca_bundle");
  return c;
}

}  // namespace ckpt::internal
