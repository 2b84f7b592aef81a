// ckpt-restore --list (plain, --json, --verify), its progress bar, and how
// it shows delta chains.
#include <string>
#include <vector>

#include "ckpt_restore_fixture.h"

namespace ckpt::restore_test {
namespace {

TEST_F(CkptRestoreTest, ListShowsEveryStep) {
  Save({100, 200, 300});
  const RunResult r = Run({"--root", root_, "--list"});
  ASSERT_EQ(r.exit_code, 0) << r;
  const std::vector<std::string> lines = Lines(r.out);
  ASSERT_GE(lines.size(), 4u) << r;
  EXPECT_TRUE(Contains(lines[0], "STEP"));
  for (int i = 0; i < 3; ++i) {
    const std::string step = absl::StrCat((i + 1) * 100);
    EXPECT_TRUE(absl::StartsWith(absl::StripLeadingAsciiWhitespace(lines[1 + i]), step)) << r;
    EXPECT_TRUE(Contains(lines[1 + i], "full      1  exact"));  // KIND, RANKS, EXACT
    EXPECT_TRUE(absl::EndsWith(lines[1 + i], "ok")) << lines[1 + i];
  }
  EXPECT_EQ(r.err, "");
}

TEST_F(CkptRestoreTest, ListJsonParses) {
  Save({100, 200, 300});
  const RunResult r = Run({"--root", root_, "--list", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r;
  const std::vector<std::string> lines = Lines(r.out);
  ASSERT_EQ(lines.size(), 3u) << r;
  for (size_t i = 0; i < lines.size(); ++i) {
    const Json row = Json::parse(lines[i]);
    EXPECT_EQ(row["step"], static_cast<int64_t>((i + 1) * 100));
    EXPECT_EQ(row["kind"], "full");
    EXPECT_EQ(row["world_size"], 1);
    EXPECT_EQ(row["tensor_count"], 4);
    EXPECT_EQ(row["tensor_bytes"], TensorBytes());
    EXPECT_GE(row["file_bytes"].get<uint64_t>(), TensorBytes());
    EXPECT_GE(row["shard_count"].get<uint64_t>(), 1u);
    EXPECT_GT(row["created_unix_ns"].get<int64_t>(), 0);
    EXPECT_EQ(row["ok"], true);
    EXPECT_TRUE(row["error"].is_null());
    EXPECT_EQ(row["dir"], StepDir((i + 1) * 100));
    EXPECT_TRUE(row["latest"].is_boolean());
  }
}

// --list --verify reads every listed checkpoint and says, per row, whether it
// verifies and why not; the exit status is 0 only if all do.
TEST_F(CkptRestoreTest, ListVerifyAddsAVerifiedColumn) {
  Save({100, 200, 300});
  RunResult r = Run({"--root", root_, "--list", "--verify"});
  ASSERT_EQ(r.exit_code, 0) << r;
  std::vector<std::string> lines = Lines(r.out);
  ASSERT_GE(lines.size(), 4u) << r;
  EXPECT_TRUE(absl::EndsWith(lines[0], "MANIFEST  VERIFIED")) << r;
  for (int i = 1; i <= 3; ++i) {
    EXPECT_TRUE(absl::EndsWith(lines[i], "  ok")) << lines[i];
    EXPECT_FALSE(Contains(lines[i], "FAILED")) << lines[i];
  }
  EXPECT_EQ(r.err, "");

  r = Run({"--root", root_, "--list", "--verify", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r;
  ASSERT_EQ(Lines(r.out).size(), 3u) << r;
  for (const std::string& line : Lines(r.out)) {
    const Json row = Json::parse(line);
    EXPECT_EQ(row["verified"], true) << line;
    EXPECT_TRUE(row["error"].is_null()) << line;
  }
  // Without --verify there is no such field.
  r = Run({"--root", root_, "--list", "--json"});
  EXPECT_FALSE(Json::parse(Lines(r.out)[0]).contains("verified")) << r;

  const std::string shard = DamageTensor(200, "model.fc.weight");
  r = Run({"--root", root_, "--list", "--verify"});
  EXPECT_EQ(r.exit_code, 1) << r;
  lines = Lines(r.out);
  ASSERT_GE(lines.size(), 4u) << r;
  EXPECT_TRUE(absl::EndsWith(lines[1], "  ok")) << r;
  EXPECT_TRUE(Contains(lines[2], "  FAILED: DATA_LOSS: tensor \"model.fc.weight\""));
  EXPECT_TRUE(Contains(lines[2], shard));
  EXPECT_TRUE(Contains(lines[2], "checksum mismatch"));
  EXPECT_TRUE(absl::EndsWith(lines[3], "  ok")) << r;
  EXPECT_EQ(r.err, "ckpt-restore: verification failed for 1 of 3 checkpoints: step 200\n");

  r = Run({"--root", root_, "--list", "--verify", "--json"});
  EXPECT_EQ(r.exit_code, 1) << r;
  lines = Lines(r.out);
  ASSERT_EQ(lines.size(), 3u) << r;
  const Json bad = Json::parse(lines[1]);
  EXPECT_EQ(bad["step"], 200);
  EXPECT_EQ(bad["ok"], true);  // the manifest is fine
  EXPECT_EQ(bad["verified"], false);
  EXPECT_TRUE(Contains(bad["error"].get<std::string>(), "model.fc.weight"));
  EXPECT_EQ(Json::parse(lines[0])["verified"], true);
  EXPECT_EQ(Json::parse(lines[2])["verified"], true);
  ExpectSameResultsWithProgress({"--root", root_, "--list", "--verify"});
}

// A delta verifies only if every link of its chain does: damage in a base, or
// a missing base, fails each checkpoint that depends on it.
TEST_F(CkptRestoreTest, VerifyChecksEveryLinkOfADeltaChain) {
  {
    EngineOptions options;
    options.delta.mode = DeltaOptions::Mode::kExact;
    // These tests are about chains of deltas: each against the one before.
    options.delta.base = DeltaOptions::Base::kChained;
    options.delta.max_restore_read_factor = 0;
    options.delta.full_every = 100;
    auto engine = Engine::Open(root_, options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    std::vector<float> w(4096);
    for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i);
    std::vector<TensorView> views = {{"m.w", DType::kFloat32, {4096}, w.data(), w.size() * 4}};
    for (int64_t step = 1; step <= 3; ++step) {
      w[step * 7] += 1.0f;
      ASSERT_TRUE((*engine)->Save(step, views).ok());
    }
  }
  RunResult r = Run({"--root", root_, "--list", "--verify", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r;
  std::vector<std::string> lines = Lines(r.out);
  ASSERT_EQ(lines.size(), 3u) << r;
  EXPECT_EQ(Json::parse(lines[0])["kind"], "full");
  EXPECT_EQ(Json::parse(lines[1])["base_step"], 1);
  EXPECT_EQ(Json::parse(lines[2])["base_step"], 2);
  for (const std::string& line : lines) EXPECT_EQ(Json::parse(line)["verified"], true) << line;

  // Damage step 2's delta record: 2, and 3 built on it, fail; 1 still holds.
  const TensorInfo delta = Locate(2, "m.w");
  FlipByte(StepDir(2) + "/" + delta.shard, delta.offset + delta.stored_bytes / 2);
  r = Run({"--root", root_, "--verify", "--all"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_TRUE(Contains(r.out, "step 1: ok"));
  EXPECT_TRUE(Contains(r.out, "step 2: FAILED: DATA_LOSS"));
  std::string three;
  for (const std::string& line : Lines(r.out)) {
    if (absl::StartsWith(line, "step 3: ")) three = line;
  }
  EXPECT_TRUE(Contains(three, "FAILED: DATA_LOSS")) << r;
  EXPECT_TRUE(Contains(three, StepDirName(2))) << r;  // names the damaged link
  EXPECT_TRUE(Contains(r.err, "verification failed for 2 of 3 checkpoints: steps 2, 3"));
  ExpectSameResultsWithProgress({"--root", root_, "--verify", "--all"});

  r = Run({"--root", root_, "--latest", "--verify"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_TRUE(Contains(r.err, "skipped step 3: DATA_LOSS"));
  EXPECT_TRUE(Contains(r.err, "skipped step 2: DATA_LOSS"));
  EXPECT_TRUE(Contains(r.err, "fell back to step 1"));
  EXPECT_TRUE(Contains(r.out, "newest checkpoint that verifies: step 1"));

  // A missing base fails every checkpoint built on it, naming the base.
  ASSERT_EQ(std::rename(StepDir(1).c_str(), scratch_.Join("moved").c_str()), 0);
  r = Run({"--root", root_, "--list", "--verify"});
  EXPECT_EQ(r.exit_code, 1) << r;
  lines = Lines(r.out);
  ASSERT_GE(lines.size(), 3u) << r;
  EXPECT_TRUE(Contains(lines[1], "FAILED: DATA_LOSS: base checkpoint step 1 of delta step 2"));
  EXPECT_TRUE(Contains(lines[1], "missing"));
  EXPECT_TRUE(Contains(lines[2], "FAILED: DATA_LOSS: base checkpoint step 1"));
  r = Run({"--root", root_, "--verify", "--step", "3"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_TRUE(Contains(r.out, "step 3: FAILED: DATA_LOSS: base checkpoint step 1"));
  ExpectSameResultsWithProgress({"--root", root_, "--list", "--verify", "--json"});
}

// Everything after the last '\r' of `err`'s last line: the final frame.
std::string FinalFrame(const std::string& err) {
  const std::vector<std::string> lines = Lines(err);
  if (lines.empty()) return "";
  const std::string& last = lines.back();
  const size_t cr = last.rfind('\r');
  return cr == std::string::npos ? last : last.substr(cr + 1);
}

// --progress=always draws the bar on stderr, ending at 100% with a newline;
// results on stdout are untouched by it.
TEST_F(CkptRestoreTest, ProgressAlwaysDrawsABarOnStderr) {
  Save({100, 200, 300});
  const auto start = std::chrono::steady_clock::now();
  RunResult r = Run({"--root", root_, "--verify", "--progress=always"});
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_TRUE(Contains(r.err, "\r")) << r;
  EXPECT_TRUE(absl::EndsWith(r.err, "\n")) << r;
  EXPECT_TRUE(Contains(FinalFrame(r.err), "100%")) << r;
  EXPECT_TRUE(Contains(FinalFrame(r.err), "verifying")) << r;
  EXPECT_TRUE(Contains(FinalFrame(r.err), "[####################]")) << r;
  // At most ~10 frames a second (plus the first and the last).
  const size_t frames = static_cast<size_t>(std::count(r.err.begin(), r.err.end(), '%'));
  EXPECT_LE(frames, 2 + static_cast<size_t>(seconds * 10) + 1) << r;
  EXPECT_EQ(r.out.find('\r'), std::string::npos) << r;
  EXPECT_TRUE(Contains(r.out, "step 300: ok"));

  // JSON on stdout stays one clean object per line.
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--verify", "--json"},
        std::vector<std::string>{"--list", "--verify", "--json"},
        std::vector<std::string>{"--latest", "--verify", "--json"},
        std::vector<std::string>{"--latest", "--json"}}) {
    std::vector<std::string> full = {"--root", root_, "--progress=always"};
    full.insert(full.end(), args.begin(), args.end());
    SCOPED_TRACE(absl::StrJoin(full, " "));
    r = Run(full);
    ASSERT_EQ(r.exit_code, 0) << r;
    EXPECT_TRUE(Contains(FinalFrame(r.err), "100%")) << r;
    for (const std::string& line : Lines(r.out)) {
      EXPECT_FALSE(Json::parse(line, nullptr, false).is_discarded()) << line;
    }
  }

  // Export: a bar for the verification of --latest, then one for the export.
  const std::string path = scratch_.Join("model.safetensors");
  r = Run({"--root", root_, "--latest", "--out", path, "--progress=always"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_TRUE(Contains(r.err, "verifying step 300")) << r;
  EXPECT_TRUE(Contains(FinalFrame(r.err), "exporting step 300")) << r;
  EXPECT_TRUE(Contains(FinalFrame(r.err), "100%")) << r;
  EXPECT_TRUE(Contains(r.out, "wrote " + path));
}

// A diagnostic never lands in the middle of the bar: the bar's line is erased
// first, so the diagnostic starts a line of its own.
TEST_F(CkptRestoreTest, ProgressIsErasedBeforeDiagnostics) {
  Save({100, 200});
  DamageTensor(200, "model.embed.weight");
  const RunResult r = Run({"--root", root_, "--latest", "--verify", "--progress=always"});
  ASSERT_EQ(r.exit_code, 0) << r;
  bool skipped = false;
  for (const std::string& line : Lines(r.err)) {
    const size_t at = line.find("ckpt-restore: skipped step 200");
    if (at == std::string::npos) continue;
    skipped = true;
    // It starts the line, or follows a frame that was erased: '\r', blanks, '\r'.
    if (at == 0) continue;
    const std::string before = line.substr(0, at);
    ASSERT_TRUE(absl::EndsWith(before, "\r")) << line;
    const size_t blanks = before.rfind('\r', before.size() - 2);
    ASSERT_NE(blanks, std::string::npos) << line;
    const std::string erased = before.substr(blanks + 1, before.size() - blanks - 2);
    EXPECT_GE(erased.size(), FinalFrame(before.substr(0, blanks)).size()) << line;
    EXPECT_EQ(erased.find_first_not_of(' '), std::string::npos) << line;
  }
  EXPECT_TRUE(skipped) << r;
  EXPECT_TRUE(Contains(r.err, "verifying step 100  [####################] 100%")) << r;
}

// Piped (the default, auto) or never: no bar at all.
TEST_F(CkptRestoreTest, NoProgressWhenPipedOrNever) {
  Save({100, 200});
  const std::string path = scratch_.Join("model.safetensors");
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--verify"}, std::vector<std::string>{"--list", "--verify"},
        std::vector<std::string>{"--latest"},
        std::vector<std::string>{"--verify", "--progress=never"},
        std::vector<std::string>{"--verify", "--progress=auto"},
        std::vector<std::string>{"--latest", "--out", path}}) {
    std::vector<std::string> full = {"--root", root_};
    full.insert(full.end(), args.begin(), args.end());
    SCOPED_TRACE(absl::StrJoin(full, " "));
    const RunResult r = Run(full);
    EXPECT_EQ(r.exit_code, 0) << r;
    EXPECT_EQ(r.err, "") << r;
  }
}

TEST_F(CkptRestoreTest, ListShowsDeltaBaseAndLossyBound) {
  EngineOptions options;
  options.delta.mode = DeltaOptions::Mode::kTopK;
  options.delta.topk_ratio = 0.1;
  auto engine = Engine::Open(root_, options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::vector<float> w(1000);
  for (int i = 0; i < 1000; ++i) w[i] = static_cast<float>(i);
  std::vector<TensorView> views = {{"m.w", DType::kFloat32, {1000}, w.data(), w.size() * 4}};
  ASSERT_TRUE((*engine)->Save(1, views).ok());
  for (int i = 0; i < 1000; ++i) w[i] += 0.5f + i * 1e-3f;
  ASSERT_TRUE((*engine)->Save(2, views).ok());
  RunResult r = Run({"--root", root_, "--list", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r;
  const std::vector<std::string> lines = Lines(r.out);
  ASSERT_EQ(lines.size(), 2u) << r;
  const Json full = Json::parse(lines[0]);
  const Json delta = Json::parse(lines[1]);
  EXPECT_EQ(full["kind"], "full");
  EXPECT_EQ(full["exact"], true);
  EXPECT_EQ(delta["kind"], "delta");
  EXPECT_EQ(delta["base_step"], 1);
  EXPECT_EQ(delta["exact"], false);
  EXPECT_GT(delta["error_bound"].get<double>(), 0.0);
  r = Run({"--root", root_, "--list"});
  EXPECT_NE(r.out.find("delta of 1"), std::string::npos) << r;
  EXPECT_NE(r.out.find("lossy <="), std::string::npos) << r;
  r = Run({"--root", root_, "--latest", "--verify"});
  EXPECT_EQ(r.exit_code, 0) << r;

  // Compacted (what ckpt-retain does before its base goes): a full
  // checkpoint, still lossy within the same bound.
  auto compacted = CompactToFull(root_, 2);
  ASSERT_TRUE(compacted.ok()) << compacted.status();
  r = Run({"--root", root_, "--list", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r;
  const Json after = Json::parse(Lines(r.out).at(1));
  EXPECT_EQ(after["kind"], "full");
  EXPECT_EQ(after["compacted"], true);
  EXPECT_EQ(after["exact"], false);
  EXPECT_EQ(after["error_bound"], delta["error_bound"]);
  EXPECT_EQ(Json::parse(Lines(r.out).at(0))["compacted"], false);
  r = Run({"--root", root_, "--list", "--verify"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_NE(r.out.find("full (compacted)"), std::string::npos) << r;
  EXPECT_NE(r.out.find("lossy <="), std::string::npos) << r;
}

// An independent reader of the safetensors format (spec: 8-byte little-endian
// header length, JSON header, data): the exported file holds exactly the
// checkpoint's tensors.

}  // namespace
}  // namespace ckpt::restore_test
