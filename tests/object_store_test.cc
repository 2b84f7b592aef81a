// The S3 client: SigV4 against AWS's published examples, CRC32C, XML,
// configuration, and every ObjectStore call against moto's S3 server.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <thread>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "ckpt/object_store.h"
#include "gtest/gtest.h"
#include "moto_server.h"
#include "object/crc32c.h"
#include "object/credentials.h"
#include "object/request_window.h"
#include "object/s3_object_store.h"
#include "object/s3_xml.h"
#include "object/sigv4.h"
#include "testing/fault_injection_transport.h"

namespace ckpt {
namespace {

using internal::SigningInput;

// The examples of "Signature Calculations for the Authorization Header"
// (AWS S3 API reference, sig-v4-header-based-auth): bucket examplebucket,
// 2013-05-24, us-east-1.
const ObjectCredentials kExampleKey{"AKIAIOSFODNN7EXAMPLE",
                                    "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", ""};
constexpr char kEmptySha[] = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
constexpr char kDate[] = "20130524T000000Z";

std::string SignatureOf(const std::string& authorization) {
  return authorization.substr(authorization.find("Signature=") + 10);
}

TEST(SigV4Test, AwsExampleGetObjectWithRange) {
  SigningInput in{"GET", "examplebucket.s3.amazonaws.com", "/test.txt", {},
                  {{"Range", "bytes=0-9"}, {"x-amz-content-sha256", kEmptySha},
                   {"x-amz-date", kDate}},
                  kEmptySha};
  const std::string auth = internal::SignV4(in, kExampleKey, "us-east-1", "s3", kDate);
  EXPECT_EQ(auth,
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,"
            "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date,"
            "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
}

TEST(SigV4Test, AwsExamplePutObject) {
  const std::string body = "Welcome to Amazon S3.";
  const std::string sha = internal::Sha256Hex(body);
  EXPECT_EQ(sha, "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072");
  SigningInput in{"PUT", "examplebucket.s3.amazonaws.com",
                  "/" + internal::UriEncode("test$file.text", false), {},
                  {{"Date", "Fri, 24 May 2013 00:00:00 GMT"}, {"x-amz-content-sha256", sha},
                   {"x-amz-date", kDate}, {"x-amz-storage-class", "REDUCED_REDUNDANCY"}},
                  sha};
  EXPECT_EQ(in.path, "/test%24file.text");
  EXPECT_EQ(SignatureOf(internal::SignV4(in, kExampleKey, "us-east-1", "s3", kDate)),
            "98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd");
}

TEST(SigV4Test, AwsExampleGetBucketLifecycleValuelessQuery) {
  SigningInput in{"GET", "examplebucket.s3.amazonaws.com", "/", {{"lifecycle", ""}},
                  {{"x-amz-content-sha256", kEmptySha}, {"x-amz-date", kDate}}, kEmptySha};
  EXPECT_EQ(SignatureOf(internal::SignV4(in, kExampleKey, "us-east-1", "s3", kDate)),
            "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543");
}

TEST(SigV4Test, AwsExampleListObjectsSortsQuery) {
  SigningInput in{"GET", "examplebucket.s3.amazonaws.com", "/", {{"prefix", "J"}, {"max-keys", "2"}},
                  {{"x-amz-content-sha256", kEmptySha}, {"x-amz-date", kDate}}, kEmptySha};
  EXPECT_EQ(SignatureOf(internal::SignV4(in, kExampleKey, "us-east-1", "s3", kDate)),
            "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7");
}

TEST(SigV4Test, UriEncodeKeepsUnreservedOnly) {
  EXPECT_EQ(internal::UriEncode("a b/c~d_e.f-g+h=i", false), "a%20b/c~d_e.f-g%2Bh%3Di");
  EXPECT_EQ(internal::UriEncode("a/b", true), "a%2Fb");
  EXPECT_EQ(internal::AmzDate(1369353600), kDate);
}

TEST(Crc32cTest, Rfc3720Vectors) {
  std::string zeros(32, '\0'), ones(32, '\xff'), inc(32, '\0');
  for (int i = 0; i < 32; ++i) inc[i] = static_cast<char>(i);
  EXPECT_EQ(internal::Crc32c(zeros), 0x8A9136AAu);
  EXPECT_EQ(internal::Crc32c(ones), 0x62A8AB43u);
  EXPECT_EQ(internal::Crc32c(inc), 0x46DD794Eu);
  EXPECT_EQ(internal::Crc32c(std::string("123456789")), 0xE3069283u);
  // Continuing a checksum equals checksumming the whole.
  EXPECT_EQ(internal::Crc32c(std::string("6789"), internal::Crc32c(std::string("12345"))),
            0xE3069283u);
  EXPECT_EQ(internal::Crc32cBase64(0xE3069283u), "4waSgw==");
  EXPECT_EQ(internal::Crc32cPortable(std::string("123456789")), 0xE3069283u);
}

TEST(Crc32cTest, TheCpusInstructionAgreesWithTheTablesAtEveryLengthAndAlignment) {
  std::mt19937_64 rng(7);
  std::string bytes(4096 + 64, '\0');
  for (char& c : bytes) c = static_cast<char>(rng());
  for (size_t offset = 0; offset < 16; ++offset) {
    for (size_t length : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{63},
                          size_t{64}, size_t{1000}, size_t{4096}}) {
      std::span<const char> piece(bytes.data() + offset, length);
      EXPECT_EQ(internal::Crc32c(piece), internal::Crc32cPortable(piece))
          << "offset " << offset << " length " << length;
      // Continued from a previous piece's checksum, too.
      EXPECT_EQ(internal::Crc32c(piece, 0x12345678u), internal::Crc32cPortable(piece, 0x12345678u));
    }
  }
}

TEST(S3XmlTest, ParsesListingAndRefusesMalformed) {
  auto xml = internal::ParseXml(
      "<?xml version=\"1.0\"?><ListBucketResult xmlns=\"http://s3\"><IsTruncated>false"
      "</IsTruncated><Contents><Key>a&amp;b</Key><Size>3</Size></Contents></ListBucketResult>",
      "test");
  ASSERT_TRUE(xml.ok()) << xml.status();
  EXPECT_EQ(xml->name, "ListBucketResult");
  EXPECT_EQ(xml->Child("Contents")->ChildText("Key"), "a&b");
  EXPECT_EQ(internal::ParseXml("<a><b></a>", "test").status().code(), absl::StatusCode::kDataLoss);
  std::string deep;
  for (int i = 0; i < 100; ++i) deep += "<a>";
  for (int i = 0; i < 100; ++i) deep += "</a>";
  EXPECT_EQ(internal::ParseXml(deep, "test").status().code(), absl::StatusCode::kDataLoss);
}

TEST(ObjectUrlTest, ParsesAndRefuses) {
  auto url = ParseObjectUrl("s3://my-bucket/runs/a/");
  ASSERT_TRUE(url.ok());
  EXPECT_EQ(url->bucket, "my-bucket");
  EXPECT_EQ(url->prefix, "runs/a");
  EXPECT_FALSE(ParseObjectUrl("s3://Bad_Bucket/x").ok());
  EXPECT_FALSE(ParseObjectUrl("/local/dir").ok());
  EXPECT_TRUE(IsObjectUrl("s3://b/p"));
  EXPECT_FALSE(IsObjectUrl("/s3://b"));
}

// Configuration the way the AWS tools take it.
class ConfigTest : public ::testing::Test {
 protected:
  std::map<std::string, std::string> env_;
  internal::EnvLookup Lookup() {
    return [this](const char* name) -> const char* {
      auto it = env_.find(name);
      return it == env_.end() ? nullptr : it->second.c_str();
    };
  }
  std::string WriteFile(const std::string& name, const std::string& text) {
    const std::string path = ::testing::TempDir() + name;
    std::ofstream(path) << text;
    return path;
  }
};

TEST_F(ConfigTest, EnvironmentWinsOverProfile) {
  env_["AWS_ACCESS_KEY_ID"] = "AK";
  env_["AWS_SECRET_ACCESS_KEY"] = "SK";
  env_["AWS_SESSION_TOKEN"] = "TOK";
  env_["AWS_REGION"] = "eu-west-1";
  env_["AWS_SHARED_CREDENTIALS_FILE"] =
      WriteFile("creds1", "[default]\naws_access_key_id = P\naws_secret_access_key = Q\n");
  auto c = internal::ResolveConfig({}, Lookup());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->credentials.access_key_id, "AK");
  EXPECT_EQ(c->credentials.session_token, "TOK");
  EXPECT_EQ(c->region, "eu-west-1");
  EXPECT_EQ(c->endpoint, "https://s3.eu-west-1.amazonaws.com");
  EXPECT_FALSE(c->path_style);
}

TEST_F(ConfigTest, ProfileFromSharedFilesAndCustomEndpointIsPathStyle) {
  env_["AWS_PROFILE"] = "minio";
  env_["AWS_SHARED_CREDENTIALS_FILE"] =
      WriteFile("creds2", "[default]\naws_access_key_id=D\naws_secret_access_key=E\n"
                          "[minio]\naws_access_key_id = MK\naws_secret_access_key = MS\n");
  env_["AWS_CONFIG_FILE"] = WriteFile(
      "config2", "[profile minio]\nregion = auto\nendpoint_url = http://127.0.0.1:9000/\n"
                 "ca_bundle = /etc/ssl/ca.pem\n");
  auto c = internal::ResolveConfig({}, Lookup());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->credentials.access_key_id, "MK");
  EXPECT_EQ(c->region, "auto");
  EXPECT_EQ(c->endpoint, "http://127.0.0.1:9000");
  EXPECT_TRUE(c->path_style);
  EXPECT_EQ(c->ca_bundle, "/etc/ssl/ca.pem");
  env_["AWS_ENDPOINT_URL_S3"] = "https://s3.example";
  env_["AWS_ENDPOINT_URL"] = "https://other.example";
  EXPECT_EQ(internal::ResolveConfig({}, Lookup())->endpoint, "https://s3.example");
}

TEST_F(ConfigTest, CredentialProcessOfTheProfile) {
  env_["AWS_PROFILE"] = "sso";
  env_["AWS_SHARED_CREDENTIALS_FILE"] = "/nonexistent";
  env_["AWS_CONFIG_FILE"] = WriteFile(
      "config3",
      "[profile sso]\ncredential_process = printf '{\"Version\": 1, \"AccessKeyId\": \"PK\", "
      "\"SecretAccessKey\": \"PS\", \"SessionToken\": \"PT\"}'\n");
  auto c = internal::ResolveConfig({}, Lookup());
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(c->fetch_credentials != nullptr);
  struct NoRequests final : HttpTransport {
    absl::StatusOr<HttpResponse> Send(const HttpRequest& r) override {
      return absl::InternalError("a credential_process needs no request: " + r.url);
    }
  } unused;
  auto got = c->fetch_credentials(unused);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->credentials.access_key_id, "PK");
  EXPECT_EQ(got->credentials.session_token, "PT");
  EXPECT_FALSE(got->expires.has_value());

  // Temporary credentials it prints (an Expiration) are fetched again, by
  // running it again: it ran once when resolving, once more now.
  const std::string counter = ::testing::TempDir() + "process-runs";
  std::filesystem::remove(counter);
  const std::string script = WriteFile(
      "process.sh", absl::StrCat("echo run >> ", counter, "\nn=$(wc -l < ", counter,
                                 ")\nprintf '{\"Version\": 1, \"AccessKeyId\": \"K%s\", \"SecretAccessKey\": \"S\", "
                                 "\"SessionToken\": \"T\", \"Expiration\": \"2099-01-01T00:00:00Z\"}' $n\n"));
  env_["AWS_CONFIG_FILE"] = WriteFile("config-process", absl::StrCat("[profile sso]\ncredential_process = sh ", script, "\n"));
  auto temporary = internal::ResolveConfig({}, Lookup());
  ASSERT_TRUE(temporary.ok()) << temporary.status();
  auto first = temporary->fetch_credentials(unused);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->credentials.access_key_id, "K1") << "the run made when resolving";
  ASSERT_TRUE(first->expires.has_value());
  EXPECT_EQ(*first->expires, absl::FromCivil(absl::CivilSecond(2099, 1, 1, 0, 0, 0), absl::UTCTimeZone()));
  auto second = temporary->fetch_credentials(unused);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->credentials.access_key_id, "K2");

  env_["AWS_CONFIG_FILE"] = WriteFile("config4", "[profile sso]\ncredential_process = false\n");
  auto failed = internal::ResolveConfig({}, Lookup());
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(failed.status().message(), "credential_process")) << failed.status();
}

TEST_F(ConfigTest, NoCredentialsSaysWhereItLooked) {
  env_["HOME"] = "/nonexistent";
  // Nothing configured: EC2 instance metadata is the last place to ask.
  auto imds = internal::ResolveConfig({}, Lookup());
  ASSERT_TRUE(imds.ok()) << imds.status();
  EXPECT_TRUE(imds->fetch_credentials != nullptr);
  EXPECT_EQ(imds->credentials_source, "EC2 instance metadata at http://169.254.169.254");
  env_["AWS_EC2_METADATA_DISABLED"] = "true";
  auto c = internal::ResolveConfig({}, Lookup());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(c.status().message(), "AWS_ACCESS_KEY_ID")) << c.status();
  EXPECT_TRUE(absl::StrContains(c.status().message(), "AWS_WEB_IDENTITY_TOKEN_FILE")) << c.status();
}

// Answers the credential services' requests the way they do (IMDSv2, STS,
// the container endpoint), records them, and sends anything else on to
// `next` (moto) when there is one.
class CredentialServices final : public HttpTransport {
 public:
  explicit CredentialServices(std::shared_ptr<HttpTransport> next = nullptr) : next_(std::move(next)) {}
  absl::StatusOr<HttpResponse> Send(const HttpRequest& r) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      seen_.push_back(r.method + " " + r.url);
      for (const auto& [k, v] : r.headers) {
        if (k == "x-amz-security-token") tokens_.push_back(v);
        if (k == "x-aws-ec2-metadata-token" || k == "authorization" || k == "x-amz-sso_bearer_token") {
          auth_.push_back(v);
        }
      }
      // One fetch: one answer with credentials.
      if (r.url == "http://imds.test/latest/meta-data/iam/security-credentials/trainer-role" ||
          r.url == "http://sts.test/" || r.url == "http://ecs.test/creds" ||
          absl::StartsWith(r.url, "http://sso.test/federation/credentials?")) {
        ++fetches_;
        body_ = std::string(r.body.begin(), r.body.end());
        bodies_.push_back(body_);
      }
    }
    HttpResponse out;
    out.status = 200;
    const std::string expires = absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now() + lifetime_, absl::UTCTimeZone());
    const std::string json = absl::StrCat(R"({"Code": "Success", "AccessKeyId": "testing", "SecretAccessKey": "testing", "Token": "T)",
                                          fetches_, R"(", "Expiration": ")", expires, R"("})");
    if (r.url == "http://imds.test/latest/api/token") {
      if (r.method != "PUT") out.status = 405;
      out.body = "SESSION";
    } else if (r.url == "http://imds.test/latest/meta-data/iam/security-credentials/") {
      out.body = "trainer-role\n";
    } else if (r.url == "http://imds.test/latest/meta-data/iam/security-credentials/trainer-role") {
      out.body = json;
    } else if (r.url == "http://ecs.test/creds") {
      out.body = json;
    } else if (r.url == "http://oidc.test/token") {
      std::lock_guard<std::mutex> lock(mu_);
      oidc_bodies_.emplace_back(r.body.begin(), r.body.end());
      out.body = absl::StrCat(R"({"accessToken": "renewed-)", oidc_bodies_.size(),
                              R"(", "expiresIn": 3600, "refreshToken": "rt-next", "tokenType": "Bearer"})");
    } else if (absl::StartsWith(r.url, "http://sso.test/federation/credentials?")) {
      out.body = absl::StrCat(R"({"roleCredentials": {"accessKeyId": "S)", fetches_,
                              R"(", "secretAccessKey": "testing", "sessionToken": "SSO)", fetches_,
                              R"(", "expiration": )", absl::ToUnixMillis(absl::Now() + lifetime_), "}}");
    } else if (r.url == "http://sts.test/" && absl::StrContains(body_, "Action=AssumeRole&")) {
      out.body = absl::StrCat(
          "<AssumeRoleResponse xmlns=\"https://sts.amazonaws.com/doc/2011-06-15/\"><AssumeRoleResult>"
          "<Credentials><AccessKeyId>R", fetches_, "</AccessKeyId><SecretAccessKey>testing</SecretAccessKey>"
          "<SessionToken>A", fetches_, "</SessionToken><Expiration>", expires,
          "</Expiration></Credentials></AssumeRoleResult></AssumeRoleResponse>");
    } else if (r.url == "http://sts.test/") {
      out.body = absl::StrCat(
          "<AssumeRoleWithWebIdentityResponse xmlns=\"https://sts.amazonaws.com/doc/2011-06-15/\">"
          "<AssumeRoleWithWebIdentityResult><Credentials><AccessKeyId>testing</AccessKeyId>"
          "<SecretAccessKey>testing</SecretAccessKey><SessionToken>W", fetches_, "</SessionToken><Expiration>",
          expires, "</Expiration></Credentials></AssumeRoleWithWebIdentityResult>"
          "</AssumeRoleWithWebIdentityResponse>");
    } else if (next_ != nullptr) {
      return next_->Send(r);
    } else {
      out.status = 404;
    }
    return out;
  }
  std::mutex mu_;
  std::vector<std::string> seen_, tokens_, auth_, bodies_, oidc_bodies_;
  std::string body_;
  int fetches_ = 0;
  absl::Duration lifetime_ = absl::Hours(1);

 private:
  std::shared_ptr<HttpTransport> next_;
};

TEST_F(ConfigTest, InstanceMetadataCredentialsThroughIMDSv2) {
  env_["HOME"] = "/nonexistent";
  env_["AWS_EC2_METADATA_SERVICE_ENDPOINT"] = "http://imds.test/";
  auto c = internal::ResolveConfig({}, Lookup());
  ASSERT_TRUE(c.ok()) << c.status();
  CredentialServices services;
  auto got = c->fetch_credentials(services);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->credentials.access_key_id, "testing");
  EXPECT_EQ(got->credentials.session_token, "T1");
  ASSERT_TRUE(got->expires.has_value());
  EXPECT_GT(*got->expires, absl::Now() + absl::Minutes(50));
  EXPECT_EQ(services.seen_.front(), "PUT http://imds.test/latest/api/token");
  EXPECT_EQ(services.auth_, (std::vector<std::string>{"SESSION", "SESSION"}));  // the session token, v2
}

TEST_F(ConfigTest, WebIdentityComesBeforeTheProfileAndReadsTheTokenEachTime) {
  env_["AWS_SHARED_CREDENTIALS_FILE"] =
      WriteFile("creds5", "[default]\naws_access_key_id = P\naws_secret_access_key = Q\n");
  env_["AWS_WEB_IDENTITY_TOKEN_FILE"] = WriteFile("token5", "eyJ.first\n");
  env_["AWS_ROLE_ARN"] = "arn:aws:iam::123456789012:role/trainer";
  env_["AWS_ENDPOINT_URL_STS"] = "http://sts.test";
  auto c = internal::ResolveConfig({}, Lookup());
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(c->fetch_credentials != nullptr) << "the profile's keys won";
  CredentialServices services;
  auto got = c->fetch_credentials(services);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->credentials.session_token, "W1");
  EXPECT_TRUE(got->expires.has_value());
  EXPECT_TRUE(absl::StrContains(services.body_, "Action=AssumeRoleWithWebIdentity")) << services.body_;
  EXPECT_TRUE(absl::StrContains(services.body_, "RoleArn=arn%3Aaws%3Aiam%3A%3A123456789012%3Arole%2Ftrainer"))
      << services.body_;
  EXPECT_TRUE(absl::StrContains(services.body_, "WebIdentityToken=eyJ.first")) << services.body_;
  WriteFile("token5", "eyJ.rotated\n");  // the platform rotates the file
  ASSERT_TRUE(c->fetch_credentials(services).ok());
  EXPECT_TRUE(absl::StrContains(services.body_, "WebIdentityToken=eyJ.rotated")) << services.body_;
}

// A profile with role_arn and source_profile (a cross-account role, as
// `aws configure` writes it): STS AssumeRole signed for "sts" with the source
// profile's keys; a role whose source is itself a role is a chain, each link
// signed with the credentials of the one before.
TEST_F(ConfigTest, RoleOfAProfileIsAssumedWithItsSourceProfilesKeysAndChains) {
  env_["HOME"] = "/nonexistent";
  env_["AWS_PROFILE"] = "trainer";
  env_["AWS_ENDPOINT_URL_STS"] = "http://sts.test";
  env_["AWS_REGION"] = "eu-west-1";
  env_["AWS_CONFIG_FILE"] = WriteFile(
      "config-role",
      "[profile trainer]\nrole_arn = arn:aws:iam::222222222222:role/checkpoints\nsource_profile = hub\n"
      "external_id = team-7\nduration_seconds = 7200\nrole_session_name = run-42\n"
      "[profile hub]\nrole_arn = arn:aws:iam::111111111111:role/hub\nsource_profile = base\n"
      "[profile base]\naws_access_key_id = BASEKEY\naws_secret_access_key = BASESECRET\n"
      "[profile self]\nrole_arn = arn:aws:iam::3:role/self\nsource_profile = self\n"
      "aws_access_key_id = SELFKEY\naws_secret_access_key = SELFSECRET\n");
  auto c = internal::ResolveConfig({}, Lookup());
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(c->fetch_credentials != nullptr);
  EXPECT_TRUE(absl::StrContains(c->credentials_source, "arn:aws:iam::222222222222:role/checkpoints"))
      << c->credentials_source;
  CredentialServices services;
  auto got = c->fetch_credentials(services);
  ASSERT_TRUE(got.ok()) << got.status();
  // Two requests: hub's role with base's keys, then trainer's with hub's.
  ASSERT_EQ(services.bodies_.size(), 2u);
  EXPECT_TRUE(absl::StrContains(services.bodies_[0], "RoleArn=arn%3Aaws%3Aiam%3A%3A111111111111%3Arole%2Fhub"))
      << services.bodies_[0];
  EXPECT_TRUE(absl::StrContains(services.bodies_[1], "Action=AssumeRole&")) << services.bodies_[1];
  EXPECT_TRUE(absl::StrContains(services.bodies_[1], "RoleArn=arn%3Aaws%3Aiam%3A%3A222222222222%3Arole%2Fcheckpoints"))
      << services.bodies_[1];
  EXPECT_TRUE(absl::StrContains(services.bodies_[1], "RoleSessionName=run-42")) << services.bodies_[1];
  EXPECT_TRUE(absl::StrContains(services.bodies_[1], "ExternalId=team-7")) << services.bodies_[1];
  EXPECT_TRUE(absl::StrContains(services.bodies_[1], "DurationSeconds=7200")) << services.bodies_[1];
  ASSERT_EQ(services.auth_.size(), 2u);
  EXPECT_TRUE(absl::StartsWith(services.auth_[0], "AWS4-HMAC-SHA256 Credential=BASEKEY/")) << services.auth_[0];
  EXPECT_TRUE(absl::StrContains(services.auth_[0], "/eu-west-1/sts/aws4_request")) << services.auth_[0];
  EXPECT_TRUE(absl::StartsWith(services.auth_[1], "AWS4-HMAC-SHA256 Credential=R1/")) << services.auth_[1];
  EXPECT_EQ(services.tokens_, (std::vector<std::string>{"A1"})) << "the second link carries the first's token";
  EXPECT_EQ(got->credentials.access_key_id, "R2");
  EXPECT_EQ(got->credentials.session_token, "A2");
  EXPECT_TRUE(got->expires.has_value());

  // source_profile naming the profile itself: its own keys.
  env_["AWS_PROFILE"] = "self";
  auto self = internal::ResolveConfig({}, Lookup());
  ASSERT_TRUE(self.ok()) << self.status();
  CredentialServices services2;
  ASSERT_TRUE(self->fetch_credentials(services2).ok());
  ASSERT_EQ(services2.auth_.size(), 1u);
  EXPECT_TRUE(absl::StartsWith(services2.auth_[0], "AWS4-HMAC-SHA256 Credential=SELFKEY/")) << services2.auth_[0];
}

// A profile `aws configure sso` wrote: the token `aws sso login` cached under
// ~/.aws/sso/cache/<sha1 of the session name>.json is exchanged at the portal
// for the role's credentials; the older form keys the cache by the start URL.
// An expired login says to log in again, before any request.
TEST_F(ConfigTest, SsoProfileUsesTheCachedLoginAndSaysToLogInWhenItExpired) {
  const std::string home = ::testing::TempDir() + "sso-home";
  std::filesystem::remove_all(home);  // no login left by an earlier run
  std::filesystem::create_directories(home + "/.aws/sso/cache");
  env_["HOME"] = home;
  env_["AWS_PROFILE"] = "research";
  env_["AWS_ENDPOINT_URL_SSO"] = "http://sso.test";
  env_["AWS_CONFIG_FILE"] = WriteFile(
      "config-sso",
      "[profile research]\nsso_session = my-sso\nsso_account_id = 123456789012\n"
      "sso_role_name = Trainer\nregion = eu-west-1\n"
      "[sso-session my-sso]\nsso_region = eu-west-1\nsso_start_url = https://example.awsapps.com/start\n"
      "[profile legacy]\nsso_start_url = https://example.awsapps.com/start\nsso_region = us-east-1\n"
      "sso_account_id = 210987654321\nsso_role_name = Reader\n"
      "[profile chained]\nrole_arn = arn:aws:iam::333333333333:role/ckpt\nsource_profile = research\n");
  auto login = [&](const std::string& cache_key_sha1, const std::string& token, absl::Time expires) {
    std::ofstream(home + "/.aws/sso/cache/" + cache_key_sha1 + ".json")
        << R"({"startUrl": "https://example.awsapps.com/start", "region": "eu-west-1", "accessToken": ")" << token
        << R"(", "expiresAt": ")" << absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", expires, absl::UTCTimeZone())
        << "\"}";
  };
  // sha1("my-sso") and sha1("https://example.awsapps.com/start"), from Python's hashlib.
  const std::string session_file = "0ad374308c5a4e22f723adf10145eafad7c4031c";
  const std::string start_url_file = "e8be5486177c5b5392bd9aa76563515b29358e6e";
  auto missing = internal::ResolveConfig({}, Lookup());
  ASSERT_TRUE(missing.ok()) << missing.status();
  CredentialServices none;
  auto not_logged_in = missing->fetch_credentials(none);
  EXPECT_EQ(not_logged_in.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(not_logged_in.status().message(), "aws sso login --profile research"))
      << not_logged_in.status();
  EXPECT_TRUE(none.seen_.empty());

  login(session_file, "session-token", absl::Now() + absl::Hours(8));
  auto c = internal::ResolveConfig({}, Lookup());
  ASSERT_TRUE(c.ok()) << c.status();
  CredentialServices services;
  auto got = c->fetch_credentials(services);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(services.seen_,
            (std::vector<std::string>{"GET http://sso.test/federation/credentials?account_id=123456789012&role_name=Trainer"}));
  EXPECT_EQ(services.auth_, (std::vector<std::string>{"session-token"}));
  EXPECT_EQ(got->credentials.access_key_id, "S1");
  EXPECT_EQ(got->credentials.session_token, "SSO1");
  ASSERT_TRUE(got->expires.has_value());
  EXPECT_GT(*got->expires, absl::Now() + absl::Minutes(50));

  // A role whose source_profile is the SSO profile: signed with its credentials.
  env_["AWS_PROFILE"] = "chained";
  env_["AWS_ENDPOINT_URL_STS"] = "http://sts.test";
  auto chained = internal::ResolveConfig({}, Lookup());
  ASSERT_TRUE(chained.ok()) << chained.status();
  CredentialServices services3;
  auto role = chained->fetch_credentials(services3);
  ASSERT_TRUE(role.ok()) << role.status();
  ASSERT_EQ(services3.auth_.size(), 2u);
  EXPECT_EQ(services3.auth_[0], "session-token");
  EXPECT_TRUE(absl::StartsWith(services3.auth_[1], "AWS4-HMAC-SHA256 Credential=S1/")) << services3.auth_[1];
  EXPECT_EQ(services3.tokens_, (std::vector<std::string>{"SSO1"}));

  // The older form: the cache is keyed by the start URL.
  env_["AWS_PROFILE"] = "legacy";
  login(start_url_file, "legacy-token", absl::Now() - absl::Minutes(1));  // expired
  auto legacy = internal::ResolveConfig({}, Lookup());
  ASSERT_TRUE(legacy.ok()) << legacy.status();
  CredentialServices services4;
  auto expired = legacy->fetch_credentials(services4);
  EXPECT_EQ(expired.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(expired.status().message(), "expired")) << expired.status();
  EXPECT_TRUE(absl::StrContains(expired.status().message(), "aws sso login --profile legacy")) << expired.status();
  login(start_url_file, "legacy-token", absl::Now() + absl::Hours(1));
  auto fresh = legacy->fetch_credentials(services4);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_EQ(services4.seen_,
            (std::vector<std::string>{"GET http://sso.test/federation/credentials?account_id=210987654321&role_name=Reader"}));
  EXPECT_EQ(services4.auth_, (std::vector<std::string>{"legacy-token"}));
}

// An sso_session login whose hour is up is renewed the way the AWS CLI
// renews it (CreateToken with the cached refresh token and client
// registration), the cache file rewritten, so a job outlives the token; a
// login that cannot be renewed says to log in again.
TEST_F(ConfigTest, AnSsoSessionLoginIsRenewedWithItsRefreshToken) {
  const std::string home = ::testing::TempDir() + "sso-renew-home";
  std::filesystem::remove_all(home);
  std::filesystem::create_directories(home + "/.aws/sso/cache");
  env_["HOME"] = home;
  env_["AWS_PROFILE"] = "research";
  env_["AWS_ENDPOINT_URL_SSO"] = "http://sso.test";
  env_["AWS_ENDPOINT_URL_SSO_OIDC"] = "http://oidc.test";
  env_["AWS_CONFIG_FILE"] = WriteFile(
      "config-sso-renew",
      "[profile research]\nsso_session = my-sso\nsso_account_id = 123456789012\nsso_role_name = Trainer\n"
      "[sso-session my-sso]\nsso_region = eu-west-1\nsso_start_url = https://example.awsapps.com/start\n");
  const std::string cache = home + "/.aws/sso/cache/0ad374308c5a4e22f723adf10145eafad7c4031c.json";  // sha1("my-sso")
  auto utc = [](absl::Time t) { return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", t, absl::UTCTimeZone()); };
  auto login = [&](absl::Time token_expires, absl::Time registration_expires) {
    std::ofstream(cache) << R"({"startUrl": "https://example.awsapps.com/start", "region": "eu-west-1", )"
                         << R"("accessToken": "old", "expiresAt": ")" << utc(token_expires)
                         << R"(", "refreshToken": "rt-1", "clientId": "cid", "clientSecret": "csecret", )"
                         << R"("registrationExpiresAt": ")" << utc(registration_expires) << "\"}";
  };
  login(absl::Now() - absl::Minutes(1), absl::Now() + absl::Hours(24 * 30));
  auto c = internal::ResolveConfig({}, Lookup());
  ASSERT_TRUE(c.ok()) << c.status();
  CredentialServices services;
  auto got = c->fetch_credentials(services);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(services.oidc_bodies_.size(), 1u);
  EXPECT_TRUE(absl::StrContains(services.oidc_bodies_[0], R"("grantType":"refresh_token")")) << services.oidc_bodies_[0];
  EXPECT_TRUE(absl::StrContains(services.oidc_bodies_[0], R"("refreshToken":"rt-1")")) << services.oidc_bodies_[0];
  EXPECT_TRUE(absl::StrContains(services.oidc_bodies_[0], R"("clientSecret":"csecret")")) << services.oidc_bodies_[0];
  EXPECT_EQ(services.auth_, (std::vector<std::string>{"renewed-1"})) << "the portal was asked with the renewed token";
  std::ifstream in(cache);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_TRUE(absl::StrContains(text.str(), R"("accessToken":"renewed-1")")) << text.str();
  EXPECT_TRUE(absl::StrContains(text.str(), R"("refreshToken":"rt-next")")) << text.str();
  EXPECT_TRUE(absl::StrContains(text.str(), R"("clientId":"cid")")) << "the rest kept: " << text.str();
  // The renewed login is valid for an hour: the next fetch renews nothing.
  ASSERT_TRUE(c->fetch_credentials(services).ok());
  EXPECT_EQ(services.oidc_bodies_.size(), 1u);
  EXPECT_EQ(services.auth_.back(), "renewed-1");

  // An expired client registration cannot renew the login: log in again.
  login(absl::Now() - absl::Minutes(1), absl::Now() - absl::Hours(1));
  auto refused = c->fetch_credentials(services);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "could not be renewed")) << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "aws sso login --profile research")) << refused.status();
}

// What a job cannot use is refused when the store opens, naming the profile
// and what to do, before any request.
TEST_F(ConfigTest, RoleProfilesAJobCannotUseAreRefusedSayingWhy) {
  env_["HOME"] = "/nonexistent";
  env_["AWS_ENDPOINT_URL_STS"] = "http://sts.test";
  auto refused = [&](const std::string& profile, const std::string& config) {
    env_["AWS_PROFILE"] = profile;
    env_["AWS_CONFIG_FILE"] = WriteFile("config-bad-role", config);
    return internal::ResolveConfig({}, Lookup()).status();
  };
  absl::Status mfa = refused("p", "[profile p]\nrole_arn = arn:r\nsource_profile = b\nmfa_serial = arn:mfa\n"
                                  "[profile b]\naws_access_key_id = K\naws_secret_access_key = S\n");
  EXPECT_EQ(mfa.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(mfa.message(), "mfa_serial")) << mfa;
  absl::Status empty = refused("p", "[profile p]\nrole_arn = arn:r\nsource_profile = b\n[profile b]\nregion = x\n");
  EXPECT_TRUE(absl::StrContains(empty.message(), "source_profile \"b\" has no aws_access_key_id")) << empty;
  absl::Status loop = refused("p", "[profile p]\nrole_arn = arn:r\nsource_profile = q\n"
                                   "[profile q]\nrole_arn = arn:s\nsource_profile = p\n");
  EXPECT_TRUE(absl::StrContains(loop.message(), "loops back")) << loop;
  absl::Status source = refused("p", "[profile p]\nrole_arn = arn:r\ncredential_source = Laptop\n");
  EXPECT_EQ(source.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(source.message(), "Environment, Ec2InstanceMetadata, EcsContainer")) << source;
  absl::Status env_missing = refused("p", "[profile p]\nrole_arn = arn:r\ncredential_source = Environment\n");
  EXPECT_TRUE(absl::StrContains(env_missing.message(), "AWS_ACCESS_KEY_ID")) << env_missing;
  absl::Status duration = refused("p", "[profile p]\nrole_arn = arn:r\ncredential_source = Ec2InstanceMetadata\n"
                                       "duration_seconds = 60\n");
  EXPECT_TRUE(absl::StrContains(duration.message(), "duration_seconds")) << duration;
}

TEST_F(ConfigTest, ContainerCredentialsWithTheirAuthorizationToken) {
  env_["HOME"] = "/nonexistent";
  env_["AWS_CONTAINER_CREDENTIALS_FULL_URI"] = "http://ecs.test/creds";
  env_["AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE"] = WriteFile("ecs-token", "pod-identity-token\n");
  auto c = internal::ResolveConfig({}, Lookup());
  ASSERT_TRUE(c.ok()) << c.status();
  CredentialServices services;
  auto got = c->fetch_credentials(services);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->credentials.session_token, "T1");
  EXPECT_EQ(services.auth_, (std::vector<std::string>{"pod-identity-token"}));
  services.fetches_ = 0;
  env_["AWS_CONTAINER_CREDENTIALS_FULL_URI"] = "http://ecs.test/elsewhere";
  auto missing = internal::ResolveConfig({}, Lookup())->fetch_credentials(services);
  EXPECT_FALSE(missing.ok());
  EXPECT_TRUE(absl::StrContains(missing.status().message(), "http://ecs.test/elsewhere")) << missing.status();
}

// Against moto.
class S3StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    bucket_ = ckpt::testing::NewTestBucket();
    ObjectStoreOptions options = ckpt::testing::SharedMotoServer().Options();
    options.list_page_size = 3;  // pagination exercised
    auto store = OpenObjectStore("s3://" + bucket_, options);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *store;
  }
  std::string bucket_;
  std::shared_ptr<ObjectStore> store_;
};

// A store whose credentials come from instance metadata signs with them
// (their session token on every request), fetches them once while they last,
// and again when less than five minutes of them are left.
// AWS in another region than the client signs for: 301 PermanentRedirect
// naming the bucket's region (x-amz-bucket-region). The store moves to that
// region's endpoint and signs for it; a custom endpoint never moves.
class RegionalAws final : public HttpTransport {
 public:
  absl::StatusOr<HttpResponse> Send(const HttpRequest& r) override {
    std::lock_guard<std::mutex> lock(mu_);
    urls_.push_back(r.url);
    for (const auto& [k, v] : r.headers) {
      if (k == "authorization") auth_.push_back(v);
    }
    HttpResponse out;
    if (absl::StrContains(r.url, ".eu-west-1.amazonaws.com/")) {
      out.status = 200;
      out.body = "payload";
    } else {
      out.status = 301;
      out.headers["x-amz-bucket-region"] = "eu-west-1";
      out.body = "<Error><Code>PermanentRedirect</Code><Message>use the bucket's endpoint</Message></Error>";
    }
    return out;
  }
  std::mutex mu_;
  std::vector<std::string> urls_, auth_;
};

TEST(RequestWindowTest, HalvesOncePerWindowOnThrottlingAndWidensByOnePerWindow) {
  internal::RequestWindow w(64);
  std::vector<internal::RequestWindow::Slot> slots(8);
  for (auto& slot : slots) ASSERT_TRUE(w.TryAcquire(&slot));  // not binding before any throttling
  for (const auto& slot : slots) w.Release(slot, /*throttled=*/true);
  EXPECT_EQ(w.halvings(), 1u);  // 8 throttled answers of one flight: one halving
  EXPECT_EQ(w.window(), 4.0);   // half of the 8 in flight, not of 64
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(w.TryAcquire(&slots[i]));
  internal::RequestWindow::Slot extra;
  EXPECT_FALSE(w.TryAcquire(&extra));
  for (int i = 0; i < 4; ++i) w.Release(slots[i], false);  // +1/window each: about one per window
  EXPECT_NEAR(w.window(), 4.92, 0.01);
  ASSERT_TRUE(w.TryAcquire(&extra));
  w.Release(extra, false);
  EXPECT_GT(w.window(), 5.0);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(w.TryAcquire(&slots[i]));
  EXPECT_FALSE(w.TryAcquire(&extra));
  w.Release(slots[0], true);  // a new flight throttled: half of the 5 in flight
  EXPECT_EQ(w.halvings(), 2u);
  EXPECT_DOUBLE_EQ(w.window(), 2.5);
  for (int i = 1; i < 5; ++i) w.Release(slots[i], true);  // same flight: no more halving
  EXPECT_EQ(w.halvings(), 2u);
  for (int i = 0; i < 40; ++i) {  // never below 1
    internal::RequestWindow::Slot one = w.Acquire();
    w.Release(one, true);
  }
  EXPECT_GE(w.window(), 1.0);
  internal::RequestWindow::Slot one;
  EXPECT_TRUE(w.TryAcquire(&one));
}

// A store that throttles (503 SlowDown to a burst of 8 concurrent requests)
// gets at most half as many at once afterwards, and every request still
// completes.
class ThrottlingStore final : public HttpTransport {
 public:
  absl::StatusOr<HttpResponse> Send(const HttpRequest&) override {
    std::unique_lock<std::mutex> lock(mu_);
    HttpResponse out;
    if (storm_left_ > 0) {
      --storm_left_;
      ++arrived_;
      cv_.notify_all();
      cv_.wait_for(lock, std::chrono::seconds(10), [&] { return arrived_ >= 8; });
      out.status = 503;
      out.body = "<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>";
      return out;
    }
    ++in_flight_;
    max_in_flight_ = std::max(max_in_flight_, in_flight_);
    lock.unlock();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    lock.lock();
    --in_flight_;
    out.status = 200;
    out.headers["etag"] = "\"e\"";
    return out;
  }
  std::mutex mu_;
  std::condition_variable cv_;
  int storm_left_ = 8, arrived_ = 0, in_flight_ = 0, max_in_flight_ = 0;
};

TEST(S3StoreThrottlingTest, ASlowDownBurstHalvesTheRequestsInFlight) {
  auto store_side = std::make_shared<ThrottlingStore>();
  ObjectStoreOptions options;
  options.credentials = ObjectCredentials{"AK", "SK", ""};
  options.endpoint = "http://127.0.0.1:1";
  options.transport = store_side;
  options.initial_backoff_ms = 1;
  options.max_backoff_ms = 2;
  auto config = internal::ResolveConfig(options, [](const char*) -> const char* { return nullptr; });
  ASSERT_TRUE(config.ok()) << config.status();
  std::shared_ptr<ObjectStore> store = internal::NewS3ObjectStore("b", *config, options);
  std::vector<std::thread> threads;
  std::vector<absl::Status> put(8);
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] { put[i] = store->Put(absl::StrCat("k", i), "v", {false, {}}).status(); });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : put) EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(store_side->arrived_, 8);
  EXPECT_GE(store_side->max_in_flight_, 1);
  EXPECT_LE(store_side->max_in_flight_, 5);  // 4 after the halving, widening by 1/4 per answer
}

TEST(S3StoreRegionTest, ABucketInAnotherRegionIsFollowedThere) {
  auto aws = std::make_shared<RegionalAws>();
  ObjectStoreOptions options;
  options.credentials = ObjectCredentials{"AK", "SK", ""};
  options.transport = aws;
  options.initial_backoff_ms = 1;
  std::map<std::string, std::string> env = {{"HOME", "/nonexistent"}};
  auto lookup = [&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  auto config = internal::ResolveConfig(options, lookup);
  ASSERT_TRUE(config.ok()) << config.status();
  std::shared_ptr<ObjectStore> store = internal::NewS3ObjectStore("ckpt-bucket", *config, options);
  auto got = store->Get("k");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "payload");
  ASSERT_EQ(aws->urls_.size(), 2u);
  EXPECT_EQ(aws->urls_[0], "https://ckpt-bucket.s3.us-east-1.amazonaws.com/k");
  EXPECT_EQ(aws->urls_[1], "https://ckpt-bucket.s3.eu-west-1.amazonaws.com/k");
  EXPECT_TRUE(absl::StrContains(aws->auth_[1], "/eu-west-1/s3/aws4_request")) << aws->auth_[1];
  ASSERT_TRUE(store->Get("k2").ok());  // and stays there
  EXPECT_EQ(aws->urls_.size(), 3u);
  // A custom endpoint (MinIO, moto) is taken as given: the 301 is an error.
  env["AWS_ENDPOINT_URL"] = "https://minio.example";
  options.max_attempts = 2;
  store = internal::NewS3ObjectStore("ckpt-bucket", *internal::ResolveConfig(options, lookup), options);
  auto refused = store->Get("k");
  EXPECT_FALSE(refused.ok());
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "PermanentRedirect")) << refused.status();
}

// An endpoint that is not an S3 server (a web server's 404 page, a typo in
// AWS_ENDPOINT_URL): the error says so, instead of an empty request id.
TEST(S3StoreErrorTest, AnAnswerThatIsNotS3sIsNamedSo) {
  struct WebServer final : HttpTransport {
    absl::StatusOr<HttpResponse> Send(const HttpRequest&) override {
      HttpResponse out;
      out.status = 404;
      out.body = "<html><body>Not Found</body></html>";
      return out;
    }
  };
  ObjectStoreOptions options;
  options.credentials = ObjectCredentials{"AK", "SK", ""};
  options.transport = std::make_shared<WebServer>();
  std::map<std::string, std::string> env = {{"HOME", "/nonexistent"},
                                            {"AWS_ENDPOINT_URL", "http://intranet.example"}};
  auto lookup = [&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  auto config = internal::ResolveConfig(options, lookup);
  ASSERT_TRUE(config.ok()) << config.status();
  auto got = internal::NewS3ObjectStore("b", *config, options)->Get("k");
  ASSERT_EQ(got.status().code(), absl::StatusCode::kNotFound) << got.status();
  EXPECT_TRUE(absl::StrContains(got.status().message(), "HTTP 404 (no S3 error code or request id: is the "
                                                        "endpoint an S3 server?)"))
      << got.status();
}

TEST(S3StoreCredentialsTest, FetchedCredentialsAreUsedAndRefreshedBeforeTheyExpire) {
  ObjectStoreOptions options = ckpt::testing::SharedMotoServer().Options();
  options.credentials.reset();
  auto services = std::make_shared<CredentialServices>(CurlHttpTransport());
  options.transport = services;
  std::map<std::string, std::string> env = {{"HOME", "/nonexistent"},
                                            {"AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://imds.test"}};
  auto config = internal::ResolveConfig(options, [&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
  ASSERT_TRUE(config.ok()) << config.status();
  const std::string bucket = ckpt::testing::NewTestBucket();
  std::shared_ptr<ObjectStore> store = internal::NewS3ObjectStore(bucket, *config, options);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(store->Put(absl::StrCat("k", i), "v", {false, {}}).ok());
  EXPECT_EQ(services->fetches_, 1);
  EXPECT_EQ(services->tokens_, (std::vector<std::string>{"T1", "T1", "T1"}));
  services->lifetime_ = absl::Minutes(2);  // the next ones expire soon: fetched again each time
  store = internal::NewS3ObjectStore(bucket, *config, options);
  ASSERT_TRUE(store->Get("k0").ok());
  ASSERT_TRUE(store->Get("k1").ok());
  EXPECT_EQ(services->fetches_, 3);
  EXPECT_EQ(services->tokens_.back(), "T3");
}

// The role of a profile assumed at a real STS (moto's, on the same server as
// its S3): the store's requests carry the role's session credentials.
TEST(S3StoreCredentialsTest, ARoleOfTheProfileIsAssumedAtStsAndItsCredentialsUsed) {
  ObjectStoreOptions options = ckpt::testing::SharedMotoServer().Options();
  options.credentials.reset();
  auto services = std::make_shared<CredentialServices>(CurlHttpTransport());
  options.transport = services;
  const std::string config = ::testing::TempDir() + "config-moto-role";
  std::ofstream(config) << "[profile trainer]\nrole_arn = arn:aws:iam::123456789012:role/checkpoints\n"
                           "source_profile = base\nrole_session_name = ckpt-test\n"
                           "[profile base]\naws_access_key_id = testing\naws_secret_access_key = testing\n";
  std::map<std::string, std::string> env = {{"HOME", "/nonexistent"},
                                            {"AWS_PROFILE", "trainer"},
                                            {"AWS_CONFIG_FILE", config},
                                            {"AWS_ENDPOINT_URL", ckpt::testing::SharedMotoServer().endpoint()}};
  auto resolved = internal::ResolveConfig(options, [&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  const std::string bucket = ckpt::testing::NewTestBucket();
  std::shared_ptr<ObjectStore> store = internal::NewS3ObjectStore(bucket, *resolved, options);
  const std::string value = "written with the role's credentials";
  ASSERT_TRUE(store->Put("k", value, {false, {}}).ok());
  auto back = store->Get("k");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, value);
  // Every S3 request carried the session token STS handed out (the base
  // profile has none), and STS was asked once.
  ASSERT_EQ(services->tokens_.size(), 2u);
  EXPECT_FALSE(services->tokens_[0].empty());
  EXPECT_EQ(services->tokens_[0], services->tokens_[1]);
  EXPECT_EQ(std::count_if(services->seen_.begin(), services->seen_.end(),
                          [](const std::string& s) { return absl::StartsWith(s, "POST "); }),
            1);
}

TEST_F(S3StoreTest, PutGetRangeHeadDelete) {
  std::string data(100000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7 + 3);
  ASSERT_TRUE(store_->Put("dir/a b+c", data, {false, {{"ckpt-xxh3", "abc"}}}).ok());
  auto whole = store_->Get("dir/a b+c");
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(*whole, data);
  std::string part(1000, '\0');
  auto n = store_->GetRange("dir/a b+c", 99500, std::span<char>(part));
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 500u);
  EXPECT_EQ(part.substr(0, 500), data.substr(99500));
  EXPECT_EQ(*store_->GetRange("dir/a b+c", 100000, std::span<char>(part)), 0u);
  auto head = store_->Head("dir/a b+c");
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(head->size, data.size());
  EXPECT_EQ(head->metadata["ckpt-xxh3"], "abc");
  ASSERT_TRUE(store_->Delete("dir/a b+c").ok());
  EXPECT_EQ(store_->Head("dir/a b+c").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(store_->Delete("dir/a b+c").ok());
}

// S3's check of what it receives, in front of moto (which checks neither):
// a body that does not match its x-amz-checksum-crc32c is refused with 400
// BadDigest, one that does not match its signed SHA-256 with 400
// XAmzContentSHA256Mismatch, and nothing is stored.
class ChecksumCheckingServer final : public HttpTransport {
 public:
  explicit ChecksumCheckingServer(std::shared_ptr<HttpTransport> base) : base_(std::move(base)) {}
  absl::StatusOr<HttpResponse> Send(const HttpRequest& r) override {
    for (const auto& [name, value] : r.headers) {
      const bool crc = name == "x-amz-checksum-crc32c" && value != internal::Crc32cBase64(internal::Crc32c(r.body));
      const bool sha = name == "x-amz-content-sha256" && value != "UNSIGNED-PAYLOAD" &&
                       value != internal::Sha256Hex(r.body);
      if (crc || sha) {
        ++refused_;
        HttpResponse out;
        out.status = 400;
        out.body = absl::StrCat("<Error><Code>", crc ? "BadDigest" : "XAmzContentSHA256Mismatch",
                                "</Code><Message>the body does not match its checksum</Message></Error>");
        return out;
      }
    }
    return base_->Send(r);
  }
  std::atomic<int> refused_{0};

 private:
  std::shared_ptr<HttpTransport> base_;
};

// A body damaged on the way up is refused by a store that checks checksums;
// the client holds the right bytes and sends them again, for a single PUT
// (signed payload and CRC32C) and for a part of a multipart upload alike.
TEST_F(S3StoreTest, ABodyDamagedOnTheWayIsRefusedByTheStoreThenSentAgain) {
  auto server = std::make_shared<ChecksumCheckingServer>(CurlHttpTransport());
  auto wire = std::make_shared<testing::FaultInjectionTransport>(server);
  ObjectStoreOptions options = ckpt::testing::SharedMotoServer().Options();
  options.transport = wire;
  options.initial_backoff_ms = 1;
  auto store = OpenObjectStore("s3://" + bucket_, options);
  ASSERT_TRUE(store.ok()) << store.status();
  std::string data(200000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 13 + 1);

  wire->Arm(0, testing::TransportFault::kCorruptBody);
  ASSERT_TRUE((*store)->Put("whole", data, {}).ok());
  EXPECT_TRUE(wire->fired());
  EXPECT_EQ(server->refused_, 1);
  EXPECT_EQ(*store_->Get("whole"), data);

  auto id = (*store)->CreateMultipartUpload("parts", {});
  ASSERT_TRUE(id.ok()) << id.status();
  wire->Arm(wire->requests(), testing::TransportFault::kCorruptBody);
  auto part = (*store)->UploadPart("parts", *id, 1, data);
  ASSERT_TRUE(part.ok()) << part.status();
  EXPECT_EQ(server->refused_, 2);
  const std::vector<UploadedPart> parts = {*part};
  ASSERT_TRUE((*store)->CompleteMultipartUpload("parts", *id, parts, false).ok());
  EXPECT_EQ(*store_->Get("parts"), data);
}

TEST_F(S3StoreTest, MissingKeyErrorNamesBucketKeyStatusAndRequestId) {
  auto got = store_->Get("no/such");
  ASSERT_EQ(got.status().code(), absl::StatusCode::kNotFound);
  const std::string message(got.status().message());
  EXPECT_TRUE(absl::StrContains(message, "s3://" + bucket_ + "/no/such")) << message;
  EXPECT_TRUE(absl::StrContains(message, "HTTP 404")) << message;
  EXPECT_TRUE(absl::StrContains(message, "NoSuchKey")) << message;
  // moto puts it in the error body only (S3 sends the x-amz-request-id header too).
  EXPECT_TRUE(absl::StrContains(message, "(request id ")) << message;
  EXPECT_FALSE(absl::StrContains(message, "(request id )")) << message;
}

TEST_F(S3StoreTest, ConditionalPutRefusesAnExistingKey) {
  ASSERT_TRUE(store_->Put("marker", std::string("one"), {true, {}}).ok());
  auto again = store_->Put("marker", std::string("two"), {true, {}});
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists) << again.status();
  EXPECT_EQ(*store_->Get("marker"), "one");
}

TEST_F(S3StoreTest, ListPaginatesAndRollsUpPrefixes) {
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(store_->Put(absl::StrCat("p/f", i), std::string("x"), {}).ok());
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(store_->Put(absl::StrCat("p/d", i, "/x"), std::string("x"), {}).ok());
  }
  auto flat = store_->List("p/", "");
  ASSERT_TRUE(flat.ok()) << flat.status();
  EXPECT_EQ(flat->objects.size(), 13u);
  auto rolled = store_->List("p/", "/");
  ASSERT_TRUE(rolled.ok()) << rolled.status();
  EXPECT_EQ(rolled->objects.size(), 8u);
  EXPECT_EQ(rolled->prefixes.size(), 5u);
  EXPECT_EQ(rolled->prefixes[0], "p/d0/");
}

TEST_F(S3StoreTest, MultipartUploadCompletesListsAndAborts) {
  std::string a(300000, 'a'), b(1000, 'b');
  auto id = store_->CreateMultipartUpload("big", {});
  ASSERT_TRUE(id.ok()) << id.status();
  auto uploads = store_->ListMultipartUploads("");
  ASSERT_TRUE(uploads.ok()) << uploads.status();
  ASSERT_EQ(uploads->size(), 1u);
  EXPECT_EQ((*uploads)[0].upload_id, *id);
  std::vector<UploadedPart> parts;
  for (auto [n, data] : {std::pair{1, &a}, std::pair{2, &b}}) {
    auto part = store_->UploadPart("big", *id, n, *data);
    ASSERT_TRUE(part.ok()) << part.status();
    parts.push_back(*part);
  }
  auto done = store_->CompleteMultipartUpload("big", *id, parts, true);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(*store_->Get("big"), a + b);
  EXPECT_TRUE(store_->ListMultipartUploads("")->empty());

  auto other = store_->CreateMultipartUpload("big2", {});
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE(store_->AbortMultipartUpload("big2", *other).ok());
  EXPECT_TRUE(store_->ListMultipartUploads("")->empty());
  EXPECT_EQ(store_->Head("big2").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(S3StoreTest, ConnectionRefusedIsRetriedThenUnavailable) {
  ObjectStoreOptions options = ckpt::testing::SharedMotoServer().Options();
  options.endpoint = "http://127.0.0.1:1";
  options.max_attempts = 3;
  auto store = OpenObjectStore("s3://" + bucket_, options);
  ASSERT_TRUE(store.ok());
  auto got = (*store)->Get("x");
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(got.status().message(), "gave up after 3 attempts")) << got.status();
}


// A server that refuses requests dated more than 15 minutes off its clock,
// as S3 does, saying its time in the Date header.
class SkewCheckingTransport final : public HttpTransport {
 public:
  absl::StatusOr<HttpResponse> Send(const HttpRequest& request) override {
    ++requests;
    std::string date;
    for (const auto& [name, value] : request.headers) {
      if (name == "x-amz-date") date = value;
    }
    const int64_t now = time(nullptr);
    HttpResponse response;
    if (date != internal::AmzDate(now) && date != internal::AmzDate(now - 1)) {
      response.status = 403;
      response.headers["date"] = absl::FormatTime("%a, %d %b %Y %H:%M:%S GMT",
                                                   absl::FromUnixSeconds(now), absl::UTCTimeZone());
      response.body = "<Error><Code>RequestTimeTooSkewed</Code><Message>skewed</Message></Error>";
      return response;
    }
    response.status = 200;
    response.body = "abc";
    return response;
  }
  int requests = 0;
};

TEST(ClockSkewTest, RequestTimeTooSkewedIsCorrectedFromTheServersDate) {
  auto transport = std::make_shared<SkewCheckingTransport>();
  ObjectStoreOptions options;
  options.endpoint = "http://127.0.0.1:9";
  options.credentials = ObjectCredentials{"k", "s", ""};
  options.transport = transport;
  options.unix_seconds = [] { return static_cast<int64_t>(time(nullptr)) - 3600; };  // an hour slow
  auto store = OpenObjectStore("s3://bucket", options);
  ASSERT_TRUE(store.ok());
  auto got = (*store)->Get("k");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "abc");
  EXPECT_EQ(transport->requests, 2);
  ASSERT_TRUE((*store)->Get("k").ok());
  EXPECT_EQ(transport->requests, 3);  // corrected for good
}

// On the wire: tests/object_store/fault_proxy.py between the client and moto.
class WireFaultTest : public S3StoreTest {
 protected:
  void SetUp() override {
    S3StoreTest::SetUp();
    absl::Status started = proxy_.Start(ckpt::testing::SharedMotoServer().endpoint());
    ASSERT_TRUE(started.ok()) << started;
    ObjectStoreOptions options = ckpt::testing::SharedMotoServer().Options();
    options.endpoint = proxy_.endpoint();
    options.low_speed_bytes = 1000;
    options.low_speed_seconds = 1;  // a stall is aborted after 1 s
    options.max_attempts = 4;
    auto store = OpenObjectStore("s3://" + bucket_, options);
    ASSERT_TRUE(store.ok()) << store.status();
    proxied_ = *store;
    data_.resize(300000);
    for (size_t i = 0; i < data_.size(); ++i) data_[i] = static_cast<char>(i * 13 + i / 7);
    ASSERT_TRUE(store_->Put("obj", data_, {}).ok());
  }
  void Fault(const std::string& rule) {
    auto reply = proxy_.Send("fault " + rule);
    ASSERT_TRUE(reply.ok() && *reply == "ok") << rule;
  }
  int Requests() {
    auto reply = proxy_.Send("count");
    return reply.ok() ? std::atoi(reply->c_str()) : -1;
  }
  std::string ReadAll() {
    std::string out(data_.size(), '\0');
    auto n = proxied_->GetRange("obj", 0, std::span<char>(out));
    EXPECT_TRUE(n.ok()) << n.status();
    if (n.ok()) EXPECT_EQ(*n, data_.size());
    return out;
  }
  ckpt::testing::FaultProxy proxy_;
  std::shared_ptr<ObjectStore> proxied_;
  std::string data_;
};

TEST_F(WireFaultTest, ResetMidBodyIsRetried) {
  Fault("reset 2 GET");
  EXPECT_EQ(ReadAll(), data_);
  EXPECT_EQ(Requests(), 3);
}

TEST_F(WireFaultTest, TruncatedBodyIsRetriedNeverTakenAsTheEnd) {
  Fault("truncate 1 GET");
  EXPECT_EQ(ReadAll(), data_);
  Fault("truncate 1 GET");
  auto whole = proxied_->Get("obj");
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(*whole, data_);
}

TEST_F(WireFaultTest, StalledTransferIsAbortedAndRetried) {
  Fault("stall 1 GET");
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(ReadAll(), data_);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

TEST_F(WireFaultTest, SlowDownStormBacksOffThenSucceeds) {
  Fault("503 3 PUT");
  ASSERT_TRUE(proxied_->Put("after-storm", std::string("x"), {}).ok());
  EXPECT_EQ(Requests(), 4);
  Fault("503 100");
  auto refused = proxied_->Put("never", std::string("x"), {});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "SlowDown")) << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "gave up after 4")) << refused.status();
}

TEST_F(WireFaultTest, ErrorBodyAfter200OnCompleteIsRetried) {
  auto id = proxied_->CreateMultipartUpload("mp", {});
  ASSERT_TRUE(id.ok()) << id.status();
  std::vector<UploadedPart> parts;
  for (int n = 1; n <= 2; ++n) {
    auto part = proxied_->UploadPart("mp", *id, n, std::span<const char>(data_).subspan(0, 1000));
    ASSERT_TRUE(part.ok()) << part.status();
    parts.push_back(*part);
  }
  Fault("error200 1 POST");
  auto done = proxied_->CompleteMultipartUpload("mp", *id, parts, false);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(store_->Head("mp")->size, 2000u);
}

}  // namespace
}  // namespace ckpt
