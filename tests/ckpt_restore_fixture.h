// The fixture of the ckpt-restore tests (ckpt_restore_*_test.cc): roots
// written with ckpt::Engine, damaged on disk, and the built tool run as an
// operator would run it, capturing its output and exit code.
//
// The binary is found beside the tests' build directory
// (<build>/tests/../tools/ckpt-restore) or at $CKPT_RESTORE_BIN.
#ifndef CKPT_TESTS_CKPT_RESTORE_FIXTURE_H_
#define CKPT_TESTS_CKPT_RESTORE_FIXTURE_H_

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

namespace ckpt::restore_test {

using ::ckpt::testing::OwnedTensor;
using ::ckpt::testing::RandomTensor;
using ::ckpt::testing::ScratchDir;
using ::ckpt::testing::Views;
using Json = nlohmann::json;


inline std::string RestoreBinary() {
  if (const char* env = getenv("CKPT_RESTORE_BIN"); env != nullptr && *env != '\0') return env;
  char exe[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return "";
  std::string path(exe, static_cast<size_t>(n));
  return path.substr(0, path.rfind('/')) + "/../tools/ckpt-restore";
}

inline std::string ReadFile(const std::string& path) {
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

inline std::vector<std::string> Lines(const std::string& text) {
  return absl::StrSplit(text, '\n', absl::SkipEmpty());
}

// What one run of the tool printed and returned.
struct RunResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

inline std::ostream& operator<<(std::ostream& os, const RunResult& r) {
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

}  // namespace ckpt::restore_test

#endif  // CKPT_TESTS_CKPT_RESTORE_FIXTURE_H_
