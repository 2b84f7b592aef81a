#include "object/credentials.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>

#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
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
// and parses its JSON: Version 1, AccessKeyId, SecretAccessKey, SessionToken,
// Expiration (when they are temporary).
absl::StatusOr<FetchedCredentials> RunCredentialProcess(const std::string& command) {
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
  FetchedCredentials f;
  f.credentials.access_key_id = j.value("AccessKeyId", "");
  f.credentials.secret_access_key = j.value("SecretAccessKey", "");
  f.credentials.session_token = j.value("SessionToken", "");
  const std::string expiration = j.value("Expiration", "");
  if (!expiration.empty()) {
    f.expires = ParseIso8601(expiration);
    if (!f.expires.has_value()) {
      return absl::FailedPreconditionError(absl::StrCat("credential_process \"", command,
                                                        "\" printed an Expiration that is no ISO 8601 time: ",
                                                        expiration));
    }
  }
  return f;
}

// The process run now (so a broken one fails when the store opens), and again
// at each later fetch: temporary credentials it prints (an Expiration) are
// renewed before they expire.
absl::StatusOr<CredentialsFetcher> ProcessCredentials(const std::string& command) {
  auto first = RunCredentialProcess(command);
  if (!first.ok()) return first.status();
  auto pending = std::make_shared<std::optional<FetchedCredentials>>(*std::move(first));
  auto mu = std::make_shared<std::mutex>();
  return CredentialsFetcher([command, pending, mu](HttpTransport&) -> absl::StatusOr<FetchedCredentials> {
    {
      std::lock_guard<std::mutex> lock(*mu);
      if (pending->has_value()) {
        FetchedCredentials f = **pending;
        pending->reset();
        return f;
      }
    }
    return RunCredentialProcess(command);
  });
}

using Ini = std::map<std::string, std::map<std::string, std::string>>;

// A profile's settings, from the credentials file ("[name]") or the config
// file ("[profile name]", "[default]").
struct Profiles {
  const Ini& credentials;
  const Ini& config;
  std::string Value(const std::string& profile, const std::string& key) const {
    std::string v = Lookup(credentials, profile, key);
    if (v.empty()) {
      v = Lookup(config, profile == "default" ? profile : absl::StrCat("profile ", profile), key);
    }
    return v;
  }
  bool IsSso(const std::string& profile) const {
    return !Value(profile, "sso_session").empty() || !Value(profile, "sso_start_url").empty();
  }
  bool IsRole(const std::string& profile) const {
    return !Value(profile, "role_arn").empty() &&
           (!Value(profile, "source_profile").empty() || !Value(profile, "credential_source").empty());
  }
};

// Where a role's AssumeRole requests go (as for AssumeRoleWithWebIdentity).
std::string StsEndpoint(const EnvLookup& env, const std::string& region) {
  std::string sts = Env(env, "AWS_ENDPOINT_URL_STS");
  if (sts.empty()) sts = Env(env, "AWS_ENDPOINT_URL");
  if (sts.empty()) sts = absl::StrCat("https://sts.", region, ".amazonaws.com");
  while (absl::EndsWith(sts, "/")) sts.pop_back();
  return sts;
}

// A role session's name: the one configured, else "ckpt-<pid>".
std::string SessionName(std::string configured) {
  return configured.empty() ? absl::StrCat("ckpt-", getpid()) : configured;
}

// The keys in AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN.
ObjectCredentials EnvironmentKeys(const EnvLookup& env) {
  ObjectCredentials keys;
  keys.access_key_id = Env(env, "AWS_ACCESS_KEY_ID");
  keys.secret_access_key = Env(env, "AWS_SECRET_ACCESS_KEY");
  keys.session_token = Env(env, "AWS_SESSION_TOKEN");
  return keys;
}

// The container credentials endpoint the environment names (ECS tasks, EKS
// Pod Identity), "" when none.
std::string ContainerCredentialsUrl(const EnvLookup& env) {
  const std::string full = Env(env, "AWS_CONTAINER_CREDENTIALS_FULL_URI");
  if (!full.empty()) return full;
  const std::string relative = Env(env, "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI");
  return relative.empty() ? "" : absl::StrCat("http://169.254.170.2", relative);
}

// Credentials from the container endpoint at `url`, with the authorization
// token the environment gives.
CredentialsFetcher ContainerCredentialsAt(const EnvLookup& env, const std::string& url) {
  return ContainerCredentials(url, Env(env, "AWS_CONTAINER_AUTHORIZATION_TOKEN"),
                              Env(env, "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE"));
}

// EC2 instance metadata's endpoint: AWS_EC2_METADATA_SERVICE_ENDPOINT, else
// the link-local one.
std::string InstanceMetadataEndpoint(const EnvLookup& env) {
  const std::string imds = Env(env, "AWS_EC2_METADATA_SERVICE_ENDPOINT");
  return imds.empty() ? "http://169.254.169.254" : imds;
}

// A profile's own keys (aws_access_key_id, ...); where it has none, its
// credential_process (run now, so a broken one fails here). Neither: both
// empty.
struct ProfileKeys {
  ObjectCredentials keys;
  CredentialsFetcher process;
};
absl::StatusOr<ProfileKeys> KeysOfProfile(const Profiles& profiles, const std::string& name) {
  ProfileKeys out;
  out.keys.access_key_id = profiles.Value(name, "aws_access_key_id");
  out.keys.secret_access_key = profiles.Value(name, "aws_secret_access_key");
  out.keys.session_token = profiles.Value(name, "aws_session_token");
  const std::string process = profiles.Value(name, "credential_process");
  if (out.keys.access_key_id.empty() && !process.empty()) {
    auto fetcher = ProcessCredentials(process);
    if (!fetcher.ok()) return fetcher.status();
    out.process = *std::move(fetcher);
  }
  return out;
}

// IAM Identity Center (SSO) credentials of a profile with `sso_session` (its
// `[sso-session NAME]` section giving sso_region) or the older
// `sso_start_url` + `sso_region`, and `sso_account_id` + `sso_role_name`.
absl::StatusOr<CredentialsFetcher> SsoCredentialsOf(const Profiles& profiles, const std::string& profile,
                                                    const EnvLookup& env) {
  const std::string where = absl::StrCat("profile \"", profile, "\" (SSO)");
  const std::string session = profiles.Value(profile, "sso_session");
  std::string region = profiles.Value(profile, "sso_region");
  std::string cache_key = profiles.Value(profile, "sso_start_url");
  if (!session.empty()) {
    const std::string section = absl::StrCat("sso-session ", session);
    if (profiles.config.find(section) == profiles.config.end()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": its sso_session \"", session,
                                                     "\" has no [", section, "] section in the config file"));
    }
    region = Lookup(profiles.config, section, "sso_region");
    cache_key = session;
  }
  SsoRequest request;
  if (!session.empty() && !region.empty()) {  // only these logins can be renewed
    request.oidc_endpoint = Env(env, "AWS_ENDPOINT_URL_SSO_OIDC");
    if (request.oidc_endpoint.empty()) request.oidc_endpoint = absl::StrCat("https://oidc.", region, ".amazonaws.com");
    while (absl::EndsWith(request.oidc_endpoint, "/")) request.oidc_endpoint.pop_back();
  }
  request.account_id = profiles.Value(profile, "sso_account_id");
  request.role_name = profiles.Value(profile, "sso_role_name");
  if (region.empty() || request.account_id.empty() || request.role_name.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": needs sso_region, sso_account_id and sso_role_name (as `aws configure sso` writes them)"));
  }
  request.portal_endpoint = Env(env, "AWS_ENDPOINT_URL_SSO");
  if (request.portal_endpoint.empty()) {
    request.portal_endpoint = absl::StrCat("https://portal.sso.", region, ".amazonaws.com");
  }
  while (absl::EndsWith(request.portal_endpoint, "/")) request.portal_endpoint.pop_back();
  request.cache_file = absl::StrCat(Env(env, "HOME"), "/.aws/sso/cache/", Sha1Hex(cache_key), ".json");
  request.login_command = absl::StrCat("aws sso login --profile ", profile);
  return SsoCredentials(std::move(request));
}

// The credentials a profile with `role_arn` assumes its role with, the way
// the AWS CLI finds them: `source_profile` (its keys, its credential_process,
// its web identity, or its own role: a chain) or `credential_source`
// (Environment, Ec2InstanceMetadata, EcsContainer).
absl::StatusOr<CredentialsFetcher> RoleCredentials(const Profiles& profiles, const std::string& profile,
                                                   const EnvLookup& env, const std::string& region,
                                                   int depth) {
  const std::string role_arn = profiles.Value(profile, "role_arn");
  const std::string where = absl::StrCat("profile \"", profile, "\" (role_arn ", role_arn, ")");
  if (depth > 8) {
    return absl::FailedPreconditionError(absl::StrCat(
        where, ": its source_profile chain is longer than 8 roles or loops back on itself"));
  }
  if (!profiles.Value(profile, "mfa_serial").empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        where, " asks for an MFA code (mfa_serial), which a job cannot type: give the job credentials "
               "from `aws configure export-credentials --format process` (credential_process) or "
               "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY/AWS_SESSION_TOKEN instead"));
  }
  const std::string source_profile = profiles.Value(profile, "source_profile");
  const std::string credential_source = profiles.Value(profile, "credential_source");
  CredentialsFetcher source;
  if (!source_profile.empty()) {
    if (source_profile != profile && profiles.IsRole(source_profile)) {
      auto chained = RoleCredentials(profiles, source_profile, env, region, depth + 1);
      if (!chained.ok()) return chained.status();
      source = *std::move(chained);
    } else if (source_profile != profile && !profiles.Value(source_profile, "web_identity_token_file").empty() &&
               !profiles.Value(source_profile, "role_arn").empty()) {
      source = WebIdentityCredentials(StsEndpoint(env, region), profiles.Value(source_profile, "role_arn"),
                                      SessionName(profiles.Value(source_profile, "role_session_name")),
                                      profiles.Value(source_profile, "web_identity_token_file"));
    } else if (source_profile != profile && profiles.IsSso(source_profile)) {
      auto sso = SsoCredentialsOf(profiles, source_profile, env);
      if (!sso.ok()) return sso.status();
      source = *std::move(sso);
    } else {
      auto keys = KeysOfProfile(profiles, source_profile);
      if (!keys.ok()) return keys.status();
      if (!keys->keys.access_key_id.empty()) {
        source = FixedCredentials(std::move(keys->keys));
      } else if (keys->process) {
        source = std::move(keys->process);
      } else {
        return absl::FailedPreconditionError(absl::StrCat(
            where, ": its source_profile \"", source_profile,
            "\" has no aws_access_key_id, credential_process, web_identity_token_file, SSO or role of its own"));
      }
    }
  } else if (credential_source == "Environment") {
    ObjectCredentials keys = EnvironmentKeys(env);
    if (keys.access_key_id.empty() || keys.secret_access_key.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          where, ": credential_source = Environment but AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY are not set"));
    }
    source = FixedCredentials(std::move(keys));
  } else if (credential_source == "Ec2InstanceMetadata") {
    source = InstanceMetadataCredentials(InstanceMetadataEndpoint(env));
  } else if (credential_source == "EcsContainer") {
    const std::string url = ContainerCredentialsUrl(env);
    if (url.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          where, ": credential_source = EcsContainer but neither AWS_CONTAINER_CREDENTIALS_FULL_URI nor "
                 "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI is set"));
    }
    source = ContainerCredentialsAt(env, url);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": credential_source \"", credential_source,
        "\" is none of Environment, Ec2InstanceMetadata, EcsContainer"));
  }
  AssumeRoleRequest request;
  request.sts_endpoint = StsEndpoint(env, region);
  request.region = region;
  request.role_arn = role_arn;
  request.session_name = SessionName(profiles.Value(profile, "role_session_name"));
  request.external_id = profiles.Value(profile, "external_id");
  const std::string duration = profiles.Value(profile, "duration_seconds");
  if (!duration.empty() && (!absl::SimpleAtoi(duration, &request.duration_seconds) ||
                            request.duration_seconds < 900 || request.duration_seconds > 43200)) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": duration_seconds \"", duration, "\" is not a whole number of seconds from 900 to 43200"));
  }
  return AssumeRoleCredentials(std::move(request), std::move(source));
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
  const Profiles profiles{creds_ini, config_ini};
  auto profile_value = [&](const std::string& key) { return profiles.Value(profile, key); };

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
    c.credentials = EnvironmentKeys(env);
  } else if (!token_file.empty() && !role_arn.empty()) {
    const std::string sts = StsEndpoint(env, c.region);
    c.fetch_credentials = WebIdentityCredentials(sts, role_arn, SessionName(session_name), token_file);
    c.credentials_source = absl::StrCat("web identity (", token_file, " for ", role_arn, " at ", sts, ")");
  } else if (profiles.IsRole(profile)) {
    auto role = RoleCredentials(profiles, profile, env, c.region, 0);
    if (!role.ok()) return role.status();
    c.fetch_credentials = *std::move(role);
    c.credentials_source = absl::StrCat("role ", profile_value("role_arn"), " of profile \"", profile,
                                        "\" (STS AssumeRole at ", StsEndpoint(env, c.region), ")");
  } else if (profiles.IsSso(profile)) {
    auto sso = SsoCredentialsOf(profiles, profile, env);
    if (!sso.ok()) return sso.status();
    c.fetch_credentials = *std::move(sso);
    c.credentials_source = absl::StrCat("SSO role ", profile_value("sso_role_name"), " of profile \"", profile, "\"");
  } else {
    auto keys = KeysOfProfile(profiles, profile);
    if (!keys.ok()) return keys.status();
    c.credentials = std::move(keys->keys);
    if (keys->process) {
      c.fetch_credentials = std::move(keys->process);
      c.credentials_source = absl::StrCat("credential_process of profile \"", profile, "\"");
    }
  }
  const bool keys = !c.credentials.access_key_id.empty() && !c.credentials.secret_access_key.empty();
  if (!keys && !c.fetch_credentials) {
    const std::string url = ContainerCredentialsUrl(env);
    const std::string imds_off = absl::AsciiStrToLower(Env(env, "AWS_EC2_METADATA_DISABLED"));
    if (!url.empty()) {
      c.fetch_credentials = ContainerCredentialsAt(env, url);
      c.credentials_source = absl::StrCat("the container credentials endpoint ", url);
    } else if (imds_off != "true") {
      const std::string imds = InstanceMetadataEndpoint(env);
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
