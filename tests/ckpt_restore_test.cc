// Tests of the ckpt-restore binary: checkpoints are written with ckpt::Engine,
// damaged on disk, and the built tool is run as an operator would run it.
//
// The binary is found beside this test's build directory
// (<build>/tests/../tools/ckpt-restore) or at $CKPT_RESTORE_BIN.
// Multi-rank checkpoints are written by ranks that are threads of this
// process (one Engine each, one in-process store), then listed, verified,
// shown and exported as one unit, whole or one rank's part (--rank).
// (Over 400 lines: one fixture that builds roots and runs the binary, and
// the cases of every verb and exit code against it; they share the fixture,
// so they stay in one binary.)
// (About 1400 lines, over the house ~400: one test per documented flag and
// exit code of one binary, sharing the run-the-tool fixture.)
#include <fcntl.h>
#include <limits.h>
#include <spawn.h>
#include <sys/wait.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "ckpt/catalog.h"
#include "ckpt/compact.h"
#include "ckpt/distributed.h"
#include "ckpt/engine.h"
#include "ckpt/reader.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "test_util.h"

extern char** environ;

namespace ckpt {
namespace {

using ::ckpt::testing::OwnedTensor;
using ::ckpt::testing::RandomTensor;
using ::ckpt::testing::ScratchDir;
using ::ckpt::testing::Views;
using Json = nlohmann::json;

std::string RestoreBinary() {
  if (const char* env = getenv("CKPT_RESTORE_BIN"); env != nullptr && *env != '\0') return env;
  char exe[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return "";
  std::string path(exe, static_cast<size_t>(n));
  return path.substr(0, path.rfind('/')) + "/../tools/ckpt-restore";
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Whether `text` contains `part`, saying what was missing when not.
::testing::AssertionResult Contains(const std::string& text, const std::string& part) {
  if (absl::StrContains(text, part)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << part << "' not found in:\n" << text;
}

std::vector<std::string> Lines(const std::string& text) {
  return absl::StrSplit(text, '\n', absl::SkipEmpty());
}

// What one run of the tool printed and returned.
struct RunResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

std::ostream& operator<<(std::ostream& os, const RunResult& r) {
  return os << "exit " << r.exit_code << "\n--- stdout:\n" << r.out << "--- stderr:\n" << r.err;
}

class CkptRestoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    bin_ = RestoreBinary();
    ASSERT_EQ(access(bin_.c_str(), X_OK), 0)
        << "ckpt-restore not found at '" << bin_
        << "': build the ckpt-restore target (tools/) or set CKPT_RESTORE_BIN";
    root_ = scratch_.Join("root");
  }

  // Runs ckpt-restore with `args`, capturing stdout, stderr and the exit code.
  RunResult Run(const std::vector<std::string>& args) {
    std::vector<std::string> words = {bin_};
    words.insert(words.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& w : words) argv.push_back(w.data());
    argv.push_back(nullptr);
    const std::string out_path = scratch_.Join("stdout.txt");
    const std::string err_path = scratch_.Join("stderr.txt");
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                     0644);
    posix_spawn_file_actions_addopen(&actions, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                     0644);
    pid_t pid = -1;
    const int rc = posix_spawn(&pid, bin_.c_str(), &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    RunResult result;
    if (rc != 0) {
      ADD_FAILURE() << "posix_spawn " << bin_ << ": " << strerror(rc);
      return result;
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    result.out = ReadFile(out_path);
    result.err = ReadFile(err_path);
    return result;
  }

  static std::vector<OwnedTensor> Tensors(int64_t step) {
    const uint64_t seed = static_cast<uint64_t>(step) * 16;
    return {RandomTensor("model.embed.weight", DType::kFloat32, {16, 8}, seed + 1),
            RandomTensor("model.fc.weight", DType::kFloat32, {8, 8}, seed + 2),
            RandomTensor("model.fc.bias", DType::kBFloat16, {8}, seed + 3),
            RandomTensor("optim.step", DType::kInt64, {}, seed + 4)};
  }
  static uint64_t TensorBytes() {
    uint64_t total = 0;
    for (const OwnedTensor& t : Tensors(0)) total += t.bytes.size();
    return total;
  }

  // Saves checkpoints `steps` under root_, extras {"epoch": step / 100}.
  void Save(const std::vector<int64_t>& steps) {
    EngineOptions options;
    options.shard_min_bytes = 1;  // one shard per module
    auto engine = Engine::Open(root_, options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    for (int64_t step : steps) {
      const std::vector<OwnedTensor> tensors = Tensors(step);
      auto stats = (*engine)->Save(step, Views(tensors),
                                   absl::StrFormat(R"({"epoch": %d})", step / 100));
      ASSERT_TRUE(stats.ok()) << stats.status();
    }
  }

  std::string StepDir(int64_t step) const { return root_ + "/" + StepDirName(step); }

  // Where tensor `name` of checkpoint `step` lies, from its manifest.
  TensorInfo Locate(int64_t step, const std::string& name, std::optional<int> rank = std::nullopt) {
    ReaderOptions options;
    options.step = step;
    options.rank = rank;
    auto reader = Reader::Open(root_, options);
    EXPECT_TRUE(reader.ok()) << reader.status();
    if (!reader.ok()) return {};
    const TensorInfo* info = (*reader)->Find(name);
    EXPECT_NE(info, nullptr) << name;
    return info != nullptr ? *info : TensorInfo{};
  }

  static void FlipByte(const std::string& path, uint64_t offset) {
    std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(file.is_open()) << path;
    file.seekg(static_cast<std::streamoff>(offset));
    char byte = 0;
    ASSERT_TRUE(file.read(&byte, 1)) << path << " has no byte " << offset;
    byte = static_cast<char>(byte ^ 0x5a);
    file.seekp(static_cast<std::streamoff>(offset));
    ASSERT_TRUE(file.write(&byte, 1));
  }

  // Flips a byte inside the record of `name` in checkpoint `step`; returns the
  // shard file name.
  std::string DamageTensor(int64_t step, const std::string& name) {
    const TensorInfo info = Locate(step, name);
    FlipByte(StepDir(step) + "/" + info.shard, info.offset + info.raw_bytes / 2);
    return info.shard;
  }

  // Expects a usage or lookup error: `code`, nothing on stdout, one line on
  // stderr starting "ckpt-restore: " and containing `text`.
  void ExpectError(const std::vector<std::string>& args, int code, const std::string& text) {
    SCOPED_TRACE(absl::StrJoin(args, " "));
    const RunResult r = Run(args);
    EXPECT_EQ(r.exit_code, code) << r;
    EXPECT_EQ(r.out, "") << r;
    EXPECT_EQ(Lines(r.err).size(), 1u) << r;
    EXPECT_TRUE(absl::StartsWith(r.err, "ckpt-restore: ")) << r;
    EXPECT_TRUE(Contains(r.err, text)) << r;
  }

  // With a bar the tool reads tensor by tensor to count bytes; without one it
  // streams through Reader::Verify. Expects the same results either way:
  // the same exit code and stdout, and only the bar added on stderr.
  void ExpectSameResultsWithProgress(const std::vector<std::string>& args) {
    SCOPED_TRACE(absl::StrJoin(args, " "));
    const RunResult plain = Run(args);
    std::vector<std::string> with_bar = args;
    with_bar.push_back("--progress=always");
    const RunResult drawn = Run(with_bar);
    EXPECT_EQ(drawn.exit_code, plain.exit_code) << drawn;
    EXPECT_EQ(drawn.out, plain.out);
    EXPECT_TRUE(Contains(drawn.err, "\r")) << drawn;
    for (const std::string& line : Lines(plain.err)) EXPECT_TRUE(Contains(drawn.err, line));
  }

  ScratchDir scratch_{"ckpt-restore-test"};
  std::string root_;
  std::string bin_;
};

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

TEST_F(CkptRestoreTest, PositionalRootIsAccepted) {
  Save({100});
  const RunResult r = Run({root_, "--latest", "--verify"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_TRUE(Contains(r.out, "step 100"));
}

TEST_F(CkptRestoreTest, UsageErrorsExit2) {
  Save({100});
  ExpectError({}, 2, "--root");
  ExpectError({"--list"}, 2, "--root DIR is required");
  ExpectError({"--root", root_}, 2, "nothing to do");
  ExpectError({"--root", root_, "--step", "100", "--latest"}, 2, "--step and --latest");
  ExpectError({"--root", root_, "--verify", "--all", "--step", "100"}, 2, "--all");
  ExpectError({"--root", root_, "--verify", "--all", "--latest"}, 2, "--all");
  ExpectError({"--root", root_, "--list", "--verify", "--step", "100"}, 2, "--list");
  ExpectError({"--root", root_, "--list", "--verify", "--latest"}, 2, "--list");
  ExpectError({"--root", root_, "--verify", "--progress=sometimes"}, 2,
              "--progress must be auto, always or never");
  ExpectError({"--root", root_, "--verify", "--progress"}, 2, "--progress needs a value");
  ExpectError({"--root", root_, "--list", "--step", "100"}, 2, "--list");
  ExpectError({"--root", root_, "--all"}, 2, "--all needs an action");
  ExpectError({"--root", root_, "--bogus"}, 2, "unknown flag --bogus");
  ExpectError({"--root", root_, "--step", "abc"}, 2, "--step");
  ExpectError({"--root", root_, "--step=-5"}, 2, "--step must be");
  ExpectError({"--root", root_, "--step"}, 2, "--step needs a value");
  ExpectError({"--root", root_, "--nolist=1"}, 2, "takes no value");
  ExpectError({"--root", root_, root_ + "x", "--list"}, 2, "ROOT given twice");
  ExpectError({root_, root_, "--list"}, 2, "unexpected argument");
  ExpectError({"--root", root_, "--step", "100", "--rank=-1"}, 2, "--rank must be a rank number >= 0");
  ExpectError({"--root", root_, "--step", "100", "--rank", "x"}, 2,
              "bad value 'x' for --rank: expected an integer");
  ExpectError({"--root", root_, "--rank", "0"}, 2, "--rank needs --step N or --latest");
  ExpectError({"--root", root_, "--list", "--rank", "0"}, 2, "--list and --verify always cover");
  ExpectError({"--root", root_, "--verify", "--rank", "0"}, 2, "drop --rank");
  ExpectError({"--root", root_, "--latest", "--verify", "--rank", "0"}, 2, "drop --rank");
  ExpectError({"--root", root_, "--verify", "--all", "--rank", "0"}, 2, "drop --rank");
}

TEST_F(CkptRestoreTest, MissingThingsExit3) {
  ExpectError({"--root", scratch_.Join("nope"), "--list"}, 3, "does not exist");
  { std::ofstream(scratch_.Join("file")) << "x"; }
  ExpectError({"--root", scratch_.Join("file"), "--list"}, 3, "not a directory");
  ASSERT_EQ(mkdir(root_.c_str(), 0755), 0);
  ExpectError({"--root", root_, "--list"}, 3, "no committed checkpoints");
  ExpectError({"--root", root_, "--latest", "--verify"}, 3, "no committed checkpoints");
  Save({100, 200});
  ExpectError({"--root", root_, "--step", "999"}, 3, "no checkpoint at step 999");
  ExpectError({"--root", root_, "--verify", "--step", "150"}, 3, "it has steps 100, 200");
}

// Every flag of ckpt-restore, in --help's order.
const std::vector<std::string> kRestoreFlags = {"root", "list", "verify", "step",   "latest",  "all",
                                                "rank", "json", "out",    "filter", "progress"};

// Every flag works in each way it may be spelled: --flag VALUE, --flag=VALUE,
// -flag VALUE, a boolean as --flag or --flag=true. ckpt-restore's flag names
// are single words, so their dashed and underscore spellings are the same
// string; ckpt-retain's two-word flags are tested both ways in
// retention_test.cc. "{OUT}" stands for a fresh output path.
TEST_F(CkptRestoreTest, EveryFlagWorksInEverySpelling) {
  Save({100, 200, 300});
  struct Case {
    std::string flag;
    std::vector<std::vector<std::string>> spellings;  // after --root ROOT (but for "root")
    std::string out;  // stdout shows the flag took effect
    std::string err;  // ... or stderr does
  };
  const std::vector<Case> cases = {
      {"root",
       {{"--root", root_, "--list"},
        {"--root=" + root_, "--list"},
        {"-root", root_, "--list"},
        {root_, "--list"},
        {"--list", "--", root_}},
       "300*", ""},
      {"list", {{"--list"}, {"--list=true"}, {"-list"}, {"--list=1"}}, "300*", ""},
      {"verify", {{"--verify"}, {"--verify=true"}, {"--verify=yes"}}, "step 200: ok", ""},
      {"step", {{"--step", "200"}, {"--step=200"}, {"-step", "200"}, {"-step=200"}},
       "step 200  ", ""},
      {"latest", {{"--latest"}, {"--latest=true"}, {"-latest"}}, "step 300  ", ""},
      {"all", {{"--verify", "--all"}, {"--verify", "--all=true"}, {"--verify", "-all"}},
       "step 100: ok", ""},
      {"rank",
       {{"--step", "200", "--rank", "0"},
        {"--step", "200", "--rank=0"},
        {"--step", "200", "-rank", "0"},
        {"--step=200", "-rank=0"}},
       "step 200  ", ""},
      {"json", {{"--list", "--json"}, {"--list", "--json=true"}, {"--list", "-json"}},
       "\"step\":100", ""},
      {"out",
       {{"--step", "200", "--out", "{OUT}"},
        {"--step", "200", "--out={OUT}"},
        {"--step", "200", "-out", "{OUT}"}},
       ": step 200, 4 tensors,", ""},
      {"filter",
       {{"--step", "200", "--out", "{OUT}", "--filter", "optim."},
        {"--step", "200", "--out", "{OUT}", "--filter=optim."},
        {"--step", "200", "--out", "{OUT}", "-filter", "optim."}},
       ": step 200, 1 tensors,", ""},
      {"progress",
       {{"--verify", "--progress", "always"},
        {"--verify", "--progress=always"},
        {"--verify", "-progress", "always"}},
       "step 300: ok", "verifying"},
  };
  std::vector<std::string> covered;
  int outputs = 0;
  for (const Case& c : cases) {
    covered.push_back(c.flag);
    std::string first;
    for (const std::vector<std::string>& spelling : c.spellings) {
      std::vector<std::string> args;
      if (c.flag != "root") args = {"--root", root_};
      bool writes = false;
      for (std::string arg : spelling) {
        if (absl::StrContains(arg, "{OUT}")) {
          arg = absl::StrReplaceAll(
              arg, {{"{OUT}", scratch_.Join(absl::StrCat("out", ++outputs, ".safetensors"))}});
          writes = true;
        }
        args.push_back(arg);
      }
      SCOPED_TRACE(absl::StrJoin(args, " "));
      const RunResult r = Run(args);
      ASSERT_EQ(r.exit_code, 0) << r;
      EXPECT_TRUE(Contains(r.out, c.out));
      if (!c.err.empty()) EXPECT_TRUE(Contains(r.err, c.err));
      if (writes) continue;  // stdout names the file
      if (first.empty()) {
        first = r.out;
      } else {
        EXPECT_EQ(r.out, first);
      }
    }
  }
  EXPECT_EQ(covered, kRestoreFlags);  // every flag, nothing more
}

TEST_F(CkptRestoreTest, UnknownOrMalformedFlagsExit2NamingTheFlag) {
  Save({100});
  const RunResult r = Run({"--root", root_, "--list", "--keep-last", "5"});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "ckpt-restore: unknown flag --keep-last (see --help)\n");
  ExpectError({"--root", root_, "--lst"}, 2, "unknown flag --lst (see --help)");
  ExpectError({"--root", root_, "--list", "--no-json=true"}, 2, "--no-json takes no value");
  ExpectError({"--root", root_, "--step=abc"}, 2,
              "bad value 'abc' for --step: expected an integer (see --help)");
  ExpectError({"--root", root_, "--step", "1.5"}, 2, "bad value '1.5' for --step");
  ExpectError({"--root", root_, "--list=maybe"}, 2, "bad value 'maybe' for --list");
  ExpectError({"--root", root_, "--list", "--json=2"}, 2, "bad value '2' for --json");
  ExpectError({"--root", root_, "--latest", "--out"}, 2, "--out needs a value (see --help)");
  ExpectError({"--root", root_, "--verify", "--progress=sometimes"}, 2, "(see --help)");
  // Negated booleans, as absl flags took them: --nojson, --no-json.
  RunResult plain = Run({"--root", root_, "--list", "--json", "--nojson"});
  EXPECT_EQ(plain.exit_code, 0) << plain;
  EXPECT_TRUE(Contains(plain.out, "STEP"));
  plain = Run({"--root", root_, "--list", "--json", "--no-json"});
  EXPECT_EQ(plain.exit_code, 0) << plain;
  EXPECT_TRUE(Contains(plain.out, "STEP"));
}

TEST_F(CkptRestoreTest, HelpDescribesEveryFlagAndExitCode) {
  const RunResult r = Run({"--help"});
  ASSERT_EQ(r.exit_code, 0) << r;
  // Every flag of the tool, each on its own line, followed by its help text.
  for (const char* flag : {"--root DIR", "--list", "--verify", "--step N", "--latest", "--all",
                           "--rank R", "--json", "--out FILE", "--filter PREFIX", "--progress WHEN",
                           "--help"}) {
    const std::string line = absl::StrCat("\n  ", flag, "\n      ");
    EXPECT_TRUE(Contains(r.out, line)) << flag;
  }
  for (const std::string& flag : kRestoreFlags) {
    EXPECT_TRUE(Contains(r.out, absl::StrCat("\n  --", flag))) << flag;
  }
  // -h, and --help after other flags, print the same text and exit 0.
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"-h"}, {"--root", root_, "--list", "--help"}}) {
    const RunResult again = Run(args);
    EXPECT_EQ(again.exit_code, 0) << again;
    EXPECT_EQ(again.out, r.out);
    EXPECT_EQ(again.err, "");
  }
  EXPECT_TRUE(Contains(r.out, "--list --verify"));
  EXPECT_TRUE(Contains(r.out, "auto"));
  EXPECT_TRUE(Contains(r.out, "Exit codes:"));
  for (const char* code : {"\n  0  ", "\n  1  ", "\n  2  ", "\n  3  ", "\n  4  "}) {
    EXPECT_TRUE(Contains(r.out, code));
  }
}

// ---- Multi-rank checkpoints (ckpt/distributed.h) ----------------------------
//
// Two ranks, each a thread with its own Engine on the same root, sharing an
// in-process store: step 1 full, step 2 an exact delta of it. Each rank saves
// replicated tensors (identical everywhere, written once), a rank-local one
// (same name, other contents on each rank) and one only it has.

constexpr int kWorld = 2;
constexpr absl::Duration kRankDeadline = absl::Seconds(60);

bool IsReplicated(const std::string& name) { return absl::StartsWith(name, "model."); }

// `line` with each run of spaces made one and the ends trimmed: a table row
// whatever its column widths.
std::string Squeeze(const std::string& line) {
  std::vector<std::string> words = absl::StrSplit(line, ' ', absl::SkipEmpty());
  return absl::StrJoin(words, " ");
}

// Rank `rank`'s state at `step`.
std::vector<OwnedTensor> RankState(int rank, int64_t step) {
  const uint64_t seed = static_cast<uint64_t>(step) * 64;
  std::vector<OwnedTensor> state = {
      RandomTensor("model.w", DType::kFloat32, {32, 16}, seed + 1),
      RandomTensor("model.b", DType::kBFloat16, {16}, seed + 2),
      RandomTensor("rng.state", DType::kUInt8, {96}, seed + 10 + rank),
      RandomTensor(absl::StrCat("shard.", rank, ".w"), DType::kFloat32, {8, 16}, seed + 20 + rank),
  };
  if (step > 1) {
    // A delta of step 1: a few elements of every tensor changed (the same
    // ones on every rank for the replicated tensors).
    std::vector<OwnedTensor> changed = RankState(rank, 1);
    for (size_t i = 0; i < changed.size(); ++i) {
      std::vector<uint8_t>& bytes = changed[i].bytes;
      for (size_t at = 0; at < bytes.size(); at += bytes.size() / 3 + 1) {
        bytes[at] ^= static_cast<uint8_t>(step + (IsReplicated(changed[i].name) ? 0 : rank + 1));
      }
    }
    return changed;
  }
  return state;
}

// The whole checkpoint as the Reader shows it: replicated tensors under their
// names, the others as "rank<r>/<name>", each with the bytes saved.
std::map<std::string, std::vector<uint8_t>> WholeCheckpoint(int64_t step) {
  std::map<std::string, std::vector<uint8_t>> whole;
  for (int r = 0; r < kWorld; ++r) {
    for (const OwnedTensor& t : RankState(r, step)) {
      whole[IsReplicated(t.name) ? t.name : absl::StrCat("rank", r, "/", t.name)] = t.bytes;
    }
  }
  return whole;
}

std::map<std::string, std::vector<uint8_t>> RankPart(int rank, int64_t step) {
  std::map<std::string, std::vector<uint8_t>> part;
  for (const OwnedTensor& t : RankState(rank, step)) part[t.name] = t.bytes;
  return part;
}

// The tensors of a safetensors file, by name, read with the format's spec
// alone (8-byte little-endian header length, JSON header, data).
std::map<std::string, std::vector<uint8_t>> ReadSafetensors(const std::string& path,
                                                            Json* metadata) {
  std::map<std::string, std::vector<uint8_t>> tensors;
  const std::string file = ReadFile(path);
  EXPECT_GE(file.size(), 8u) << path;
  if (file.size() < 8) return tensors;
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(file[i]);
  EXPECT_LE(8 + n, file.size()) << path;
  if (8 + n > file.size()) return tensors;
  const Json header = Json::parse(file.substr(8, n));
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (metadata != nullptr) *metadata = entry;
      continue;
    }
    const uint64_t begin = entry["data_offsets"][0], end = entry["data_offsets"][1];
    EXPECT_LE(8 + n + end, file.size()) << name;
    const char* data = file.data() + 8 + n;
    tensors[name] = std::vector<uint8_t>(data + begin, data + std::min<uint64_t>(end, file.size() - 8 - n));
  }
  return tensors;
}

std::vector<std::string> Names(const std::map<std::string, std::vector<uint8_t>>& tensors) {
  std::vector<std::string> names;
  for (const auto& [name, bytes] : tensors) names.push_back(name);
  return names;
}

class CkptRestoreMultiRankTest : public CkptRestoreTest {
 protected:
  // Saves steps 1 (full) and 2 (exact delta) of `kWorld` ranks under `root`.
  static void SaveRanks(const std::string& root) {
    std::shared_ptr<CoordinationStore> store = NewInProcessStore();
    std::vector<absl::Status> results(kWorld);
    testing::RunOrDie(
        [&] {
          std::vector<std::thread> threads;
          for (int r = 0; r < kWorld; ++r) {
            threads.emplace_back([&, r] { results[r] = SaveAsRank(root, store, r); });
          }
          for (std::thread& t : threads) t.join();
        },
        kRankDeadline, "saving a 2-rank checkpoint");
    for (int r = 0; r < kWorld; ++r) ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];
  }

  // One rank's engine: opens, saves steps 1 and 2, closes.
  static absl::Status SaveAsRank(const std::string& root,
                                 const std::shared_ptr<CoordinationStore>& store, int rank) {
    EngineOptions options;
    options.shard_min_bytes = 1;  // one shard per module
    options.delta.mode = DeltaOptions::Mode::kExact;
    // These tests are about chains of deltas: each against the one before.
    options.delta.base = DeltaOptions::Base::kChained;
    options.delta.max_restore_read_factor = 0;
    options.delta.full_every = 10;
    options.distributed.rank = rank;
    options.distributed.world_size = kWorld;
    options.distributed.store = store;
    options.distributed.key_prefix = "ckpt/restore-test";
    options.distributed.commit_timeout = absl::Seconds(30);
    auto engine = Engine::Open(root, options);
    if (!engine.ok()) return engine.status();
    for (int64_t step : {1, 2}) {
      const std::vector<OwnedTensor> state = RankState(rank, step);
      std::vector<TensorView> views = Views(state);
      for (TensorView& v : views) {
        if (IsReplicated(v.name)) v.placement = TensorPlacement::kReplicated;
        if (v.name == "rng.state") v.placement = TensorPlacement::kRankLocal;
      }
      auto handle = (*engine)->SaveAsync(step, views, absl::StrFormat(R"({"epoch": %d})", step));
      if (!handle.ok()) return handle.status();
      absl::Status saved = testing::WaitOrDie(**handle, kRankDeadline,
                                              absl::StrCat("rank ", rank, " step ", step));
      if (!saved.ok()) return saved;
    }
    return (*engine)->Close();
  }

  // Where tensor `name` of rank `rank`'s part of `step` lies.
  TensorInfo LocateInRank(int64_t step, int rank, const std::string& name) {
    return Locate(step, name, rank);
  }

  static uint64_t TotalBytes(const std::map<std::string, std::vector<uint8_t>>& tensors) {
    uint64_t total = 0;
    for (const auto& [name, bytes] : tensors) total += bytes.size();
    return total;
  }

  void SetUp() override {
    CkptRestoreTest::SetUp();
    SaveRanks(root_);
  }
};

TEST_F(CkptRestoreMultiRankTest, ListShowsTheRanksAndTheWholeCheckpointsTotals) {
  RunResult r = Run({"--root", root_, "--list"});
  ASSERT_EQ(r.exit_code, 0) << r;
  std::vector<std::string> lines = Lines(r.out);
  ASSERT_GE(lines.size(), 4u) << r;
  EXPECT_TRUE(absl::StartsWith(Squeeze(lines[0]), "STEP KIND RANKS EXACT SIZE TENSORS")) << r;
  EXPECT_TRUE(absl::StartsWith(Squeeze(lines[1]), "1 full 2 exact ")) << r;
  EXPECT_TRUE(absl::StartsWith(Squeeze(lines[2]), "2* delta of 1 2 exact ")) << r;
  EXPECT_TRUE(Contains(Squeeze(lines[1]), " 6 ")) << r;  // tensors: every rank's
  EXPECT_EQ(r.err, "");

  r = Run({"--root", root_, "--list", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r;
  lines = Lines(r.out);
  ASSERT_EQ(lines.size(), 2u) << r;
  for (int64_t step : {1, 2}) {
    const Json row = Json::parse(lines[step - 1]);
    EXPECT_EQ(row["step"], step);
    EXPECT_EQ(row["world_size"], kWorld);
    EXPECT_EQ(row["kind"], step == 1 ? "full" : "delta");
    EXPECT_EQ(row["base_step"], step == 1 ? Json(nullptr) : Json(1));
    EXPECT_EQ(row["exact"], true);
    // The parts add up: the replicated tensors once, every rank's own.
    EXPECT_EQ(row["tensor_count"], WholeCheckpoint(step).size());
    EXPECT_EQ(row["tensor_bytes"], TotalBytes(WholeCheckpoint(step)));
    EXPECT_GE(row["shard_count"].get<int>(), kWorld);
    EXPECT_EQ(row["ok"], true);
    EXPECT_EQ(row["latest"], step == 2);
  }
}

TEST_F(CkptRestoreMultiRankTest, VerifyCoversEveryRanksPart) {
  RunResult r = Run({"--root", root_, "--verify"});
  ASSERT_EQ(r.exit_code, 0) << r;
  ASSERT_EQ(Lines(r.out).size(), 2u) << r;
  for (const std::string& line : Lines(r.out)) {
    EXPECT_TRUE(Contains(line, ": ok (6 tensors, "));
    EXPECT_TRUE(absl::EndsWith(line, " shards, 2 ranks)")) << line;
  }
  EXPECT_EQ(r.err, "");

  r = Run({"--root", root_, "--verify", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r;
  ASSERT_EQ(Lines(r.out).size(), 2u) << r;
  for (const std::string& line : Lines(r.out)) {
    const Json row = Json::parse(line);
    EXPECT_EQ(row["ok"], true) << line;
    EXPECT_EQ(row["world_size"], kWorld) << line;
    EXPECT_EQ(row["tensor_count"], 6) << line;
  }
  r = Run({"--root", root_, "--list", "--verify", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r;
  for (const std::string& line : Lines(r.out)) EXPECT_EQ(Json::parse(line)["verified"], true) << line;
  r = Run({"--root", root_, "--latest", "--verify"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_TRUE(Contains(r.out, "newest checkpoint that verifies: step 2"));
  ExpectSameResultsWithProgress({"--root", root_, "--verify", "--all"});
}

// A flipped byte in one rank's shard fails the checkpoint, naming that rank's
// file; --latest falls back for every rank, even one whose own part is intact.
TEST_F(CkptRestoreMultiRankTest, DamageInOneRanksShardNamesTheRanksFile) {
  const TensorInfo info = LocateInRank(2, 1, "shard.1.w");
  ASSERT_TRUE(absl::StartsWith(info.shard, "rank-00001.")) << info.shard;
  FlipByte(StepDir(2) + "/" + info.shard, info.offset + info.stored_bytes / 2);

  RunResult r = Run({"--root", root_, "--verify", "--all"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_TRUE(Contains(r.out, "step 1: ok"));
  std::string failure;
  for (const std::string& line : Lines(r.out)) {
    if (absl::StartsWith(line, "step 2: FAILED: DATA_LOSS: ")) failure = line;
  }
  ASSERT_NE(failure, "") << r;
  EXPECT_TRUE(Contains(failure, StepDir(2) + "/" + info.shard)) << r;
  EXPECT_TRUE(Contains(failure, "\"shard.1.w\"")) << r;
  EXPECT_EQ(r.err, "ckpt-restore: verification failed for 1 of 2 checkpoints: step 2\n");
  ExpectSameResultsWithProgress({"--root", root_, "--verify", "--all"});

  r = Run({"--root", root_, "--list", "--verify", "--json"});
  EXPECT_EQ(r.exit_code, 1) << r;
  ASSERT_EQ(Lines(r.out).size(), 2u) << r;
  const Json bad = Json::parse(Lines(r.out)[1]);
  EXPECT_EQ(bad["ok"], true);  // the manifests are sound
  EXPECT_EQ(bad["verified"], false);
  EXPECT_TRUE(Contains(bad["error"].get<std::string>(), info.shard));

  r = Run({"--root", root_, "--latest", "--verify"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_TRUE(Contains(r.err, "skipped step 2: DATA_LOSS")) << r;
  EXPECT_TRUE(Contains(r.out, "newest checkpoint that verifies: step 1")) << r;
  // Rank 0 never reads rank 1's own tensors, yet restores step 1 too: every
  // rank picks the step whose every part verifies.
  const std::string path = scratch_.Join("rank0.safetensors");
  r = Run({"--root", root_, "--latest", "--rank", "0", "--out", path});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_TRUE(Contains(r.err, "fell back to step 1")) << r;
  EXPECT_EQ(r.out, absl::StrFormat("wrote %s: step 1, rank 0's part, 4 tensors, %d bytes\n", path,
                                   ReadFile(path).size()));
  EXPECT_EQ(ReadSafetensors(path, nullptr), RankPart(0, 1));
  // --step 2 --out reads the damaged record: data loss, no file.
  const std::string whole = scratch_.Join("whole.safetensors");
  r = Run({"--root", root_, "--step", "2", "--out", whole});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_TRUE(Contains(r.err, info.shard)) << r;
  EXPECT_NE(access(whole.c_str(), F_OK), 0);
}

// A rank's manifest that is missing, or a MANIFEST.json that was edited,
// damages the checkpoint as a whole: every rank's part of it.
TEST_F(CkptRestoreMultiRankTest, AMissingRankManifestIsDataLossNamingIt) {
  const std::string manifest = StepDir(2) + "/rank-00001.MANIFEST.json";
  ASSERT_EQ(unlink(manifest.c_str()), 0) << manifest;

  RunResult r = Run({"--root", root_, "--verify", "--all"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_TRUE(Contains(r.out, "step 1: ok"));
  EXPECT_TRUE(Contains(r.out, "step 2: FAILED: DATA_LOSS: rank 1's part of " + StepDir(2) +
                                  ": manifest " + manifest + " is missing"))
      << r;
  r = Run({"--root", root_, "--list"});
  EXPECT_EQ(r.exit_code, 0) << r;  // listing is informational
  EXPECT_TRUE(Contains(r.out, "DAMAGED: DATA_LOSS: rank 1's part")) << r;
  r = Run({"--root", root_, "--list", "--json"});
  ASSERT_EQ(Lines(r.out).size(), 2u) << r;
  const Json bad = Json::parse(Lines(r.out)[1]);
  EXPECT_EQ(bad["ok"], false);
  EXPECT_EQ(bad["world_size"], 0);
  EXPECT_TRUE(Contains(bad["error"].get<std::string>(), "rank-00001.MANIFEST.json"));
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--step", "2"}, std::vector<std::string>{"--step", "2", "--rank", "0"}}) {
    std::vector<std::string> full = {"--root", root_};
    full.insert(full.end(), args.begin(), args.end());
    ExpectError(full, 1, "step 2: DATA_LOSS: rank 1's part");
  }
  r = Run({"--root", root_, "--latest", "--rank", "1", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_TRUE(Contains(r.err, "skipped step 2: DATA_LOSS")) << r;
  EXPECT_EQ(Json::parse(r.out)["step"], 1) << r;
}

TEST_F(CkptRestoreMultiRankTest, AnEditedGlobalManifestIsDataLoss) {
  const std::string manifest = StepDir(2) + "/MANIFEST.json";
  std::string text = ReadFile(manifest);
  const std::string epoch = R"("epoch": 2)";
  ASSERT_TRUE(Contains(text, epoch));
  text.replace(text.find(epoch), epoch.size(), R"("epoch": 3)");
  { std::ofstream(manifest, std::ios::binary | std::ios::trunc) << text; }

  RunResult r = Run({"--root", root_, "--verify", "--step", "2"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_TRUE(Contains(r.out, "step 2: FAILED: DATA_LOSS: manifest " + manifest)) << r;
  EXPECT_TRUE(Contains(r.out, "checksum mismatch")) << r;
  r = Run({"--root", root_, "--list", "--verify"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_TRUE(Contains(Squeeze(r.out), " DAMAGED FAILED: DATA_LOSS: manifest " + manifest)) << r;
  ExpectError({"--root", root_, "--step", "2", "--rank", "1"}, 1, "MANIFEST.json");
  r = Run({"--root", root_, "--latest", "--verify"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_TRUE(Contains(r.out, "newest checkpoint that verifies: step 1")) << r;
}

// Without --rank, show and export cover the whole checkpoint under the names
// the Reader gives it: replicated tensors bare, every rank's others
// "rank<r>/<name>".
TEST_F(CkptRestoreMultiRankTest, ShowAndExportTheWholeCheckpoint) {
  RunResult r = Run({"--root", root_, "--step", "2"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_TRUE(absl::StartsWith(r.out, "step 2  " + StepDir(2) + "\nranks: 2; the whole checkpoint"))
      << r;
  EXPECT_TRUE(Contains(r.out, "\nextras: {\"epoch\":2}\n")) << r;
  EXPECT_TRUE(Contains(r.out, "PLACEMENT   RANK  SHARD")) << r;
  for (const std::string& name : Names(WholeCheckpoint(2))) {
    std::string row;
    for (const std::string& line : Lines(r.out)) {
      if (absl::StartsWith(line, name + " ")) row = line;
    }
    ASSERT_NE(row, "") << name << "\n" << r;
    const std::string placement = IsReplicated(name)                    ? " replicated "
                                  : absl::EndsWith(name, "/rng.state") ? " rank_local "
                                                                        : " default ";
    EXPECT_TRUE(Contains(row, placement)) << row;
  }
  EXPECT_TRUE(Contains(r.out, "6 tensors, ")) << r;

  r = Run({"--root", root_, "--step", "2", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r;
  const Json shown = Json::parse(r.out);
  EXPECT_EQ(shown["world_size"], kWorld);
  EXPECT_TRUE(shown["rank"].is_null());
  std::vector<std::string> names;
  for (const Json& t : shown["tensors"]) {
    names.push_back(t["name"]);
    if (absl::StartsWith(t["name"].get<std::string>(), "rank1/")) EXPECT_EQ(t["rank"], 1) << t;
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, Names(WholeCheckpoint(2)));

  for (int64_t step : {1, 2}) {
    const std::string path = scratch_.Join(absl::StrCat("whole", step, ".safetensors"));
    r = Run({"--root", root_, "--step", absl::StrCat(step), "--out", path});
    ASSERT_EQ(r.exit_code, 0) << r;
    EXPECT_TRUE(Contains(r.out, absl::StrFormat(": step %d, 6 tensors, ", step))) << r;
    Json metadata;
    EXPECT_EQ(ReadSafetensors(path, &metadata), WholeCheckpoint(step)) << "step " << step;
    EXPECT_EQ(metadata["ckpt_step"], absl::StrCat(step));
  }
  // --filter on the names shown: "rank1/" is rank 1's own tensors.
  const std::string part = scratch_.Join("rank1-own.safetensors");
  r = Run({"--root", root_, "--latest", "--out", part, "--filter", "rank1/"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(Names(ReadSafetensors(part, nullptr)),
            (std::vector<std::string>{"rank1/rng.state", "rank1/shard.1.w"}));
}

// --rank R shows and exports rank R's part: its own tensors and the
// replicated ones, under the names it saved.
TEST_F(CkptRestoreMultiRankTest, RankRestoresOneRanksPart) {
  for (int rank = 0; rank < kWorld; ++rank) {
    for (int64_t step : {1, 2}) {
      SCOPED_TRACE(absl::StrCat("rank ", rank, " step ", step));
      const std::string path = scratch_.Join(absl::StrCat("r", rank, "s", step, ".safetensors"));
      const RunResult r = Run({"--root", root_, "--step", absl::StrCat(step), "--rank",
                               absl::StrCat(rank), "--out", path});
      ASSERT_EQ(r.exit_code, 0) << r;
      EXPECT_EQ(r.out, absl::StrFormat("wrote %s: step %d, rank %d's part, 4 tensors, %d bytes\n",
                                       path, step, rank, ReadFile(path).size()));
      EXPECT_EQ(ReadSafetensors(path, nullptr), RankPart(rank, step));
    }
  }
  RunResult r = Run({"--root", root_, "--latest", "--rank", "1"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_TRUE(Contains(r.out, "ranks: 2; rank 1's part")) << r;
  EXPECT_TRUE(Contains(r.out, "\nshard.1.w ")) << r;
  EXPECT_FALSE(Contains(r.out, "shard.0.w")) << r;
  EXPECT_FALSE(Contains(r.out, "rank1/")) << r;
  EXPECT_TRUE(Contains(r.out, "; every checksum verified\n")) << r;

  r = Run({"--root", root_, "--latest", "--rank", "0", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r;
  const Json shown = Json::parse(r.out);
  EXPECT_EQ(shown["step"], 2);
  EXPECT_EQ(shown["rank"], 0);
  EXPECT_EQ(shown["world_size"], kWorld);
  EXPECT_EQ(shown["verified"], true);
  std::vector<std::string> names;
  for (const Json& t : shown["tensors"]) names.push_back(t["name"]);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, Names(RankPart(0, 2)));

  // --filter applies to the part's own names.
  const std::string model = scratch_.Join("model.safetensors");
  r = Run({"--root", root_, "--step", "2", "--rank", "1", "--out", model, "--filter", "model."});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(Names(ReadSafetensors(model, nullptr)), (std::vector<std::string>{"model.b", "model.w"}));

  ExpectError({"--root", root_, "--step", "2", "--rank", "2"}, 3, "not rank 2");
  ExpectError({"--root", root_, "--latest", "--rank", "7", "--json"}, 3, "not rank 7");
}

// A sharded tensor (two ranks' chunks of one global tensor) is listed,
// verified and exported as the global tensor.
TEST_F(CkptRestoreTest, ShardedTensorsAreShownAndExportedWhole) {
  const OwnedTensor global = RandomTensor("embed.weight", DType::kFloat32, {9, 5}, 77);
  std::shared_ptr<CoordinationStore> store = NewInProcessStore();
  std::vector<absl::Status> results(kWorld);
  auto save_as = [&](int rank) -> absl::Status {
    EngineOptions options;
    options.distributed.rank = rank;
    options.distributed.world_size = kWorld;
    options.distributed.store = store;
    options.distributed.commit_timeout = absl::Seconds(30);
    auto engine = Engine::Open(root_, options);
    if (!engine.ok()) return engine.status();
    const int64_t rows = rank == 0 ? 5 : 4;  // Shard(0) of 9 rows
    TensorView v{global.name, global.dtype, {rows, 5}, global.bytes.data() + rank * 5 * 5 * 4,
                 static_cast<size_t>(rows * 5 * 4)};
    v.placement = TensorPlacement::kSharded;
    v.global_shape = global.shape;
    v.global_offset = {rank * 5, 0};
    auto handle = (*engine)->SaveAsync(3, {&v, 1});
    if (!handle.ok()) return handle.status();
    absl::Status saved = testing::WaitOrDie(**handle, kRankDeadline, absl::StrCat("rank ", rank));
    if (!saved.ok()) return saved;
    return (*engine)->Close();
  };
  testing::RunOrDie(
      [&] {
        std::vector<std::thread> threads;
        for (int r = 0; r < kWorld; ++r) threads.emplace_back([&, r] { results[r] = save_as(r); });
        for (std::thread& t : threads) t.join();
      },
      kRankDeadline, "saving a sharded checkpoint");
  for (int r = 0; r < kWorld; ++r) ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];

  RunResult r = Run({"--root", root_, "--step", "3"});
  ASSERT_EQ(r.exit_code, 0) << r;
  std::string row;
  for (const std::string& line : Lines(r.out)) {
    if (absl::StartsWith(line, "embed.weight ")) row = line;
  }
  EXPECT_TRUE(Contains(row, "[9, 5]") && Contains(row, " sharded ") && Contains(row, " 0-1 ") &&
              Contains(row, "2 chunks")) << r;
  EXPECT_TRUE(Contains(r.out, "1 tensors, 180 B in 2 shards")) << r;
  r = Run({"--root", root_, "--step", "3", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r;
  const Json shown = Json::parse(r.out)["tensors"][0];
  EXPECT_EQ(shown["placement"], "sharded");
  ASSERT_EQ(shown["chunks"].size(), 2u);
  EXPECT_EQ(shown["chunks"][1]["offset"], Json::array({5, 0}));
  EXPECT_EQ(shown["chunks"][1]["shape"], Json::array({4, 5}));
  r = Run({"--root", root_, "--verify", "--step", "3"});
  EXPECT_EQ(r.exit_code, 0) << r;
  const std::string path = scratch_.Join("sharded.safetensors");
  r = Run({"--root", root_, "--latest", "--out", path});
  ASSERT_EQ(r.exit_code, 0) << r;
  const auto exported = ReadSafetensors(path, nullptr);
  ASSERT_EQ(exported.size(), 1u);
  EXPECT_EQ(exported.begin()->second, global.bytes);
}

TEST_F(CkptRestoreTest, RankOnASingleProcessCheckpointIsRankZeroAlone) {
  Save({100, 200});
  const RunResult plain = Run({"--root", root_, "--step", "200"});
  ASSERT_EQ(plain.exit_code, 0) << plain;
  RunResult r = Run({"--root", root_, "--step", "200", "--rank", "0"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, plain.out);
  r = Run({"--root", root_, "--latest", "--rank", "0", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(Json::parse(r.out)["world_size"], 1);
  EXPECT_EQ(Json::parse(r.out)["rank"], 0);
  const std::string path = scratch_.Join("rank0.safetensors");
  r = Run({"--root", root_, "--latest", "--rank", "0", "--out", path});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_TRUE(Contains(r.out, ": step 200, rank 0's part, 4 tensors, ")) << r;
  EXPECT_EQ(ReadSafetensors(path, nullptr).size(), 4u);
  ExpectError({"--root", root_, "--step", "200", "--rank", "1"}, 3,
              "was written by one process: it has no rank 1 (only rank 0)");
  ExpectError({"--root", root_, "--latest", "--rank", "3", "--out", scratch_.Join("x.st")}, 3,
              "no rank 3");
  EXPECT_NE(access(scratch_.Join("x.st").c_str(), F_OK), 0);
}

}  // namespace
}  // namespace ckpt
