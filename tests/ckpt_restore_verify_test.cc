// ckpt-restore --verify, --latest, --show and --out against good and
// damaged checkpoints.
#include <string>
#include <vector>

#include "ckpt_restore_fixture.h"

namespace ckpt::restore_test {
namespace {

TEST_F(CkptRestoreTest, OutWritesASafetensorsFileOthersCanRead) {
  Save({100, 200});
  const std::string path = scratch_.Join("export.safetensors");
  RunResult r = Run({"--root", root_, "--step", "200", "--out", path});
  ASSERT_EQ(r.exit_code, 0) << r;
  std::string file = ReadFile(path);
  ASSERT_GE(file.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(file[i]);
  ASSERT_LE(8 + n, file.size());
  EXPECT_EQ(n % 8, 0u);
  const Json header = Json::parse(file.substr(8, n));
  const std::string data = file.substr(8 + n);
  EXPECT_EQ(header["__metadata__"]["ckpt_step"], "200");
  EXPECT_EQ(Json::parse(header["__metadata__"]["ckpt_extras"].get<std::string>())["epoch"], 2);
  const std::map<DType, std::string> names = {{DType::kFloat32, "F32"},
                                              {DType::kBFloat16, "BF16"},
                                              {DType::kInt64, "I64"}};
  size_t covered = 0;
  for (const OwnedTensor& t : Tensors(200)) {
    ASSERT_TRUE(header.contains(t.name)) << t.name;
    const Json& e = header[t.name];
    EXPECT_EQ(e["dtype"], names.at(t.dtype)) << t.name;
    EXPECT_EQ(e["shape"].get<std::vector<int64_t>>(), t.shape) << t.name;
    const uint64_t begin = e["data_offsets"][0], end = e["data_offsets"][1];
    ASSERT_EQ(end - begin, t.bytes.size()) << t.name;
    ASSERT_LE(end, data.size());
    EXPECT_EQ(0, std::memcmp(data.data() + begin, t.bytes.data(), t.bytes.size())) << t.name;
    covered += t.bytes.size();
  }
  EXPECT_EQ(covered, data.size());
  // Never overwritten; --filter exports a part; bad combinations are usage errors.
  r = Run({"--root", root_, "--latest", "--out", path});
  EXPECT_EQ(r.exit_code, 2) << r;
  const std::string part = scratch_.Join("part.safetensors");
  r = Run({"--root", root_, "--latest", "--out", part, "--filter", "optim."});
  ASSERT_EQ(r.exit_code, 0) << r;
  const std::string part_file = ReadFile(part);
  EXPECT_NE(part_file.find("optim.step"), std::string::npos);
  EXPECT_EQ(part_file.find("model.fc.weight"), std::string::npos);
  EXPECT_EQ(Run({"--root", root_, "--out", part}).exit_code, 2);
  EXPECT_EQ(Run({"--root", root_, "--latest", "--filter", "x"}).exit_code, 2);
  EXPECT_EQ(Run({"--root", root_, "--latest", "--out", scratch_.Join("n.st"), "--filter", "nope"}).exit_code, 2);
}

TEST_F(CkptRestoreTest, VerifyPassesOnGoodData) {
  Save({100, 200, 300});
  RunResult r = Run({"--root", root_, "--verify"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_TRUE(Contains(r.out, "step 100: ok"));
  EXPECT_TRUE(Contains(r.out, "step 200: ok"));
  EXPECT_TRUE(Contains(r.out, "step 300: ok"));
  EXPECT_EQ(r.err, "");

  r = Run({"--root", root_, "--verify", "--step", "200"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(Lines(r.out).size(), 1u) << r;
  EXPECT_TRUE(Contains(r.out, "step 200: ok (4 tensors"));

  r = Run({"--root", root_, "--latest", "--verify"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_TRUE(Contains(r.out, "newest checkpoint that verifies: step 300"));
  EXPECT_EQ(r.err, "");

  r = Run({"--root", root_, "--verify", "--all", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r;
  ASSERT_EQ(Lines(r.out).size(), 3u) << r;
  for (const std::string& line : Lines(r.out)) {
    const Json row = Json::parse(line);
    EXPECT_EQ(row["ok"], true);
    EXPECT_EQ(row["tensor_count"], 4);
  }
}

TEST_F(CkptRestoreTest, FlippedByteNamesStepFileAndTensor) {
  Save({100, 200, 300});
  const std::string shard = DamageTensor(300, "model.fc.weight");
  const RunResult r = Run({"--root", root_, "--verify", "--all"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_TRUE(Contains(r.out, "step 100: ok"));
  EXPECT_TRUE(Contains(r.out, "step 200: ok"));
  std::string failure;
  for (const std::string& line : Lines(r.out)) {
    if (absl::StartsWith(line, "step 300: FAILED: ")) failure = line;
  }
  ASSERT_NE(failure, "") << r;
  EXPECT_TRUE(Contains(failure, "DATA_LOSS"));
  EXPECT_TRUE(Contains(failure, shard));
  EXPECT_TRUE(Contains(failure, "model.fc.weight"));
  EXPECT_TRUE(Contains(r.err, "ckpt-restore: verification failed for 1 of 3"));
  EXPECT_TRUE(Contains(r.err, "300"));
  ExpectSameResultsWithProgress({"--root", root_, "--verify", "--all"});

  const RunResult one = Run({"--root", root_, "--verify", "--step", "300"});
  EXPECT_EQ(one.exit_code, 1) << one;
  EXPECT_TRUE(Contains(one.out, "step 300: FAILED"));
}

TEST_F(CkptRestoreTest, LatestSkipsDamagedNewest) {
  Save({100, 200, 300});
  DamageTensor(300, "model.embed.weight");
  RunResult r = Run({"--root", root_, "--latest", "--verify"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_TRUE(Contains(r.err, "ckpt-restore: skipped step 300: DATA_LOSS"));
  EXPECT_TRUE(Contains(r.err, "model.embed.weight"));
  EXPECT_TRUE(Contains(r.err, "fell back to step 200"));
  EXPECT_TRUE(Contains(r.out, "newest checkpoint that verifies: step 200"));
  EXPECT_TRUE(Contains(r.out, "step 300: FAILED"));

  // Without --verify, --latest shows the checkpoint it fell back to.
  r = Run({"--root", root_, "--latest"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_TRUE(Contains(r.err, "skipped step 300"));
  EXPECT_TRUE(absl::StartsWith(r.out, "step 200 ")) << r;
  EXPECT_TRUE(Contains(r.out, "model.fc.weight"));
}

TEST_F(CkptRestoreTest, TruncatedShardIsDetected) {
  Save({100, 200});
  const TensorInfo info = Locate(200, "model.fc.weight");
  const std::string path = StepDir(200) + "/" + info.shard;
  ASSERT_EQ(truncate(path.c_str(), static_cast<off_t>(info.offset + info.raw_bytes / 2)), 0);
  RunResult r = Run({"--root", root_, "--verify", "--all"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_TRUE(Contains(r.out, "step 100: ok"));
  EXPECT_TRUE(Contains(r.out, "step 200: FAILED"));
  EXPECT_TRUE(Contains(r.out, info.shard));
  ExpectSameResultsWithProgress({"--root", root_, "--verify", "--all"});

  r = Run({"--root", root_, "--latest", "--verify"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_TRUE(Contains(r.err, "skipped step 200"));
  EXPECT_TRUE(Contains(r.out, "newest checkpoint that verifies: step 100"));
}

TEST_F(CkptRestoreTest, CorruptManifestIsDetected) {
  Save({100, 200});
  const std::string manifest = StepDir(200) + "/MANIFEST.json";
  const std::string text = ReadFile(manifest);
  ASSERT_GT(text.size(), 10u);
  FlipByte(manifest, text.size() / 2);

  RunResult r = Run({"--root", root_, "--list"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_TRUE(Contains(r.out, "DAMAGED: DATA_LOSS"));

  r = Run({"--root", root_, "--list", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r;
  const std::vector<std::string> lines = Lines(r.out);
  ASSERT_EQ(lines.size(), 2u) << r;
  EXPECT_EQ(Json::parse(lines[0])["ok"], true);
  const Json bad = Json::parse(lines[1]);
  EXPECT_EQ(bad["step"], 200);
  EXPECT_EQ(bad["ok"], false);
  ASSERT_TRUE(bad["error"].is_string());
  EXPECT_TRUE(Contains(bad["error"].get<std::string>(), "MANIFEST.json"));

  r = Run({"--root", root_, "--verify"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_TRUE(Contains(r.out, "step 200: FAILED: DATA_LOSS"));

  r = Run({"--root", root_, "--latest", "--verify"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_TRUE(Contains(r.err, "skipped step 200"));
  EXPECT_TRUE(Contains(r.out, "newest checkpoint that verifies: step 100"));

  r = Run({"--root", root_, "--step", "200"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_TRUE(Contains(r.err, "ckpt-restore: step 200: DATA_LOSS"));

  // --list --verify: the manifest column says DAMAGED, the verified one why.
  r = Run({"--root", root_, "--list", "--verify"});
  EXPECT_EQ(r.exit_code, 1) << r;
  std::string row;
  for (const std::string& line : Lines(r.out)) {
    if (absl::StartsWith(absl::StripLeadingAsciiWhitespace(line), "200")) row = line;
  }
  EXPECT_TRUE(Contains(row, "  DAMAGED  ")) << r;
  EXPECT_TRUE(Contains(row, "  FAILED: DATA_LOSS")) << r;
  EXPECT_TRUE(Contains(row, "MANIFEST.json")) << r;
  r = Run({"--root", root_, "--list", "--verify", "--json"});
  EXPECT_EQ(r.exit_code, 1) << r;
  ASSERT_EQ(Lines(r.out).size(), 2u) << r;
  const Json damaged = Json::parse(Lines(r.out)[1]);
  EXPECT_EQ(damaged["ok"], false);
  EXPECT_EQ(damaged["verified"], false);
  EXPECT_TRUE(Contains(damaged["error"].get<std::string>(), "MANIFEST.json"));
}

TEST_F(CkptRestoreTest, LatestFailsWhenNothingVerifies) {
  Save({100, 200});
  DamageTensor(100, "optim.step");
  DamageTensor(200, "model.fc.bias");
  const RunResult r = Run({"--root", root_, "--latest", "--verify"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_TRUE(Contains(r.err, "skipped step 200"));
  EXPECT_TRUE(Contains(r.err, "skipped step 100"));
  EXPECT_TRUE(Contains(r.err, "no checkpoint in " + root_ + " verifies"));
}

TEST_F(CkptRestoreTest, ShowPrintsTensorsAndExtras) {
  Save({100, 200});
  RunResult r = Run({"--root", root_, "--step", "200"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_TRUE(absl::StartsWith(r.out, "step 200 ")) << r;
  std::string extras;
  for (const std::string& line : Lines(r.out)) {
    if (absl::StartsWith(line, "extras: ")) extras = line.substr(8);
  }
  EXPECT_EQ(Json::parse(extras), Json::parse(R"({"epoch": 2})")) << r;
  for (const OwnedTensor& t : Tensors(200)) {
    std::string row;
    for (const std::string& line : Lines(r.out)) {
      if (absl::StartsWith(line, t.name + " ")) row = line;
    }
    ASSERT_NE(row, "") << t.name << "\n" << r;
    EXPECT_TRUE(Contains(row, std::string(DTypeName(t.dtype))));
    EXPECT_TRUE(Contains(row, absl::StrCat(" ", t.bytes.size(), " ")));
  }
  EXPECT_TRUE(Contains(r.out, "[16, 8]"));
  EXPECT_TRUE(Contains(r.out, "[]"));

  r = Run({"--root", root_, "--step", "100", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r;
  ASSERT_EQ(Lines(r.out).size(), 1u) << r;
  const Json shown = Json::parse(r.out);
  EXPECT_EQ(shown["step"], 100);
  EXPECT_EQ(shown["extras"]["epoch"], 1);
  ASSERT_EQ(shown["tensors"].size(), 4u);
  EXPECT_EQ(shown["tensors"][1]["name"], "model.fc.weight");
  EXPECT_EQ(shown["tensors"][1]["shape"], Json::array({8, 8}));
  EXPECT_EQ(shown["tensors"][1]["dtype"], "float32");
}


}  // namespace
}  // namespace ckpt::restore_test
