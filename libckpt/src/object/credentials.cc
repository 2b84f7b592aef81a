#include "object/credentials.h"

#include <unistd.h>

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

  c.region = options.region;
  if (c.region.empty()) c.region = Env(env, "AWS_REGION");
  if (c.region.empty()) c.region = Env(env, "AWS_DEFAULT_REGION");
  if (c.region.empty()) c.region = Lookup(config_ini, config_section, "region");
  if (c.region.empty()) c.region = "us-east-1";

  // The AWS SDKs' order: keys in the environment, a web identity, the
  // profile's keys, its credential_process, the container endpoint, EC2
  // instance metadata.
  c.no_credentials_hint = absl::StrCat(
      "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN, or "
      "profile \"", profile, "\" in ", credentials_file, " or ", config_file,
      "; or run where the container credentials endpoint or EC2 instance metadata serves them");
  std::string token_file = Env(env, "AWS_WEB_IDENTITY_TOKEN_FILE");
  std::string role_arn = Env(env, "AWS_ROLE_ARN");
  std::string session_name = Env(env, "AWS_ROLE_SESSION_NAME");
  if (token_file.empty() && role_arn.empty()) {
    token_file = profile_value("web_identity_token_file");
    role_arn = profile_value("role_arn");
    if (session_name.empty()) session_name = profile_value("role_session_name");
  }
  if (options.credentials.has_value()) {
    c.credentials = *options.credentials;
  } else if (!Env(env, "AWS_ACCESS_KEY_ID").empty()) {
    c.credentials.access_key_id = Env(env, "AWS_ACCESS_KEY_ID");
    c.credentials.secret_access_key = Env(env, "AWS_SECRET_ACCESS_KEY");
    c.credentials.session_token = Env(env, "AWS_SESSION_TOKEN");
  } else if (!token_file.empty() && !role_arn.empty()) {
    std::string sts = Env(env, "AWS_ENDPOINT_URL_STS");
    if (sts.empty()) sts = Env(env, "AWS_ENDPOINT_URL");
    if (sts.empty()) sts = absl::StrCat("https://sts.", c.region, ".amazonaws.com");
    while (absl::EndsWith(sts, "/")) sts.pop_back();
    if (session_name.empty()) session_name = absl::StrCat("ckpt-", getpid());
    c.fetch_credentials = WebIdentityCredentials(sts, role_arn, session_name, token_file);
    c.credentials_source = absl::StrCat("web identity (", token_file, " for ", role_arn, " at ", sts, ")");
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
  const bool keys = !c.credentials.access_key_id.empty() && !c.credentials.secret_access_key.empty();
  if (!keys && !c.fetch_credentials) {
    const std::string full = Env(env, "AWS_CONTAINER_CREDENTIALS_FULL_URI");
    const std::string relative = Env(env, "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI");
    const std::string imds_off = absl::AsciiStrToLower(Env(env, "AWS_EC2_METADATA_DISABLED"));
    if (!full.empty() || !relative.empty()) {
      const std::string url = !full.empty() ? full : absl::StrCat("http://169.254.170.2", relative);
      c.fetch_credentials = ContainerCredentials(url, Env(env, "AWS_CONTAINER_AUTHORIZATION_TOKEN"),
                                                 Env(env, "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE"));
      c.credentials_source = absl::StrCat("the container credentials endpoint ", url);
    } else if (imds_off != "true") {
      std::string imds = Env(env, "AWS_EC2_METADATA_SERVICE_ENDPOINT");
      if (imds.empty()) imds = "http://169.254.169.254";
      c.fetch_credentials = InstanceMetadataCredentials(imds);
      c.credentials_source = absl::StrCat("EC2 instance metadata at ", imds);
    }
  }
  if (!keys && !c.fetch_credentials) {
    return absl::FailedPreconditionError(absl::StrCat("no S3 credentials: ", c.no_credentials_hint));
  }

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
  c.aws_endpoint = !custom;

  c.ca_bundle = options.ca_bundle;
  if (c.ca_bundle.empty()) c.ca_bundle = Env(env, "AWS_CA_BUNDLE");
  if (c.ca_bundle.empty()) c.ca_bundle = Lookup(config_ini, config_section, "ca_bundle");
  return c;
}

}  // namespace ckpt::internal
