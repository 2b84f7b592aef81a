// ckpt-restore on an s3:// root (moto): --list, --verify and --latest --out
// read straight from the bucket and agree with the local root; damage in the
// bucket is found; a root that is not committed there is not found.
#include "ckpt_restore_fixture.h"
#include "ckpt/object_tier.h"
#include "moto_server.h"

namespace ckpt::restore_test {
namespace {

class CkptRestoreS3Test : public CkptRestoreTest {
 protected:
  void SetUp() override {
    CkptRestoreTest::SetUp();
    auto& server = ckpt::testing::SharedMotoServer();
    server.ExportEnvironment();  // the spawned tool inherits it
    bucket_ = ckpt::testing::NewTestBucket();
    url_ = absl::StrCat("s3://", bucket_, "/run");
    auto store = OpenObjectStore(url_, server.Options());
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *store;
  }
  void Publish() {
    auto steps = ListSteps(root_);
    ASSERT_TRUE(steps.ok());
    for (int64_t step : *steps) {
      PublishOptions options;
      options.part_bytes = 4096;
      auto published = PublishCheckpoint(root_, step, *store_, "run", options);
      ASSERT_TRUE(published.ok()) << published.status();
    }
  }
  std::string bucket_, url_;
  std::shared_ptr<ObjectStore> store_;
};

TEST_F(CkptRestoreS3Test, ListVerifyAndExportFromTheBucketMatchTheLocalRoot) {
  Save({100, 200, 300});
  Publish();
  RunResult local = Run({"--root", root_, "--list", "--json"});
  RunResult remote = Run({"--root", url_, "--list", "--json"});
  ASSERT_EQ(remote.exit_code, 0) << remote;
  ASSERT_EQ(Lines(remote.out).size(), 3u) << remote;
  for (size_t i = 0; i < 3; ++i) {
    Json a = Json::parse(Lines(local.out)[i]), b = Json::parse(Lines(remote.out)[i]);
    EXPECT_EQ(a["step"], b["step"]);
    EXPECT_EQ(a["tensor_bytes"], b["tensor_bytes"]) << b;
  }
  RunResult verified = Run({"--root", url_, "--verify"});
  EXPECT_EQ(verified.exit_code, 0) << verified;
  const std::string mine = scratch_.Join("local.safetensors");
  const std::string theirs = scratch_.Join("s3.safetensors");
  ASSERT_EQ(Run({"--root", root_, "--latest", "--out", mine}).exit_code, 0);
  RunResult exported = Run({"--root", url_, "--latest", "--out", theirs});
  ASSERT_EQ(exported.exit_code, 0) << exported;
  EXPECT_EQ(ReadFile(mine), ReadFile(theirs));
}

TEST_F(CkptRestoreS3Test, DamageInTheBucketIsFoundAndTheNewestIntactStepUsed) {
  Save({100, 200});
  Publish();
  const TensorInfo t = Locate(200, "model.embed.weight");
  const std::string key = absl::StrCat(StepPrefix("run", 200), "/", t.shard);
  std::string bytes = *store_->Get(key);
  bytes[t.offset + 5] ^= 0x01;
  ASSERT_TRUE(store_->Put(key, bytes, {}).ok());
  RunResult verified = Run({"--root", url_, "--step", "200", "--verify"});
  EXPECT_EQ(verified.exit_code, 1) << verified;
  EXPECT_TRUE(Contains(verified.out + verified.err, "model.embed.weight")) << verified;
  EXPECT_TRUE(Contains(verified.out + verified.err, key)) << verified;
  RunResult latest = Run({"--root", url_, "--latest", "--verify"});
  EXPECT_EQ(latest.exit_code, 0) << latest;
  EXPECT_TRUE(Contains(latest.out + latest.err, "skipped step 200")) << latest;
}

TEST_F(CkptRestoreS3Test, EmptyPrefixIsNotFound) {
  RunResult r = Run({"--root", url_ + "-nothing", "--list"});
  EXPECT_EQ(r.exit_code, 3) << r;
}

}  // namespace
}  // namespace ckpt::restore_test
