#include "moto_server.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace ckpt::testing {

MotoServer::~MotoServer() {
  if (to_child_ >= 0) close(to_child_);  // EOF: the script stops the server
  if (from_child_ >= 0) close(from_child_);
  if (pid_ > 0) {
    for (int i = 0; i < 100; ++i) {
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) return;
      usleep(50 * 1000);
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

absl::Status MotoServer::Start() { return StartScript("s3_server.py", ""); }

absl::Status MotoServer::StartScript(const std::string& script_name, const std::string& arg) {
  const std::string script = std::string(CKPT_TESTS_DIR "/object_store/") + script_name;
  int in[2], out[2];
  if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) {
    return absl::InternalError("pipe2 failed");
  }
  pid_ = fork();
  if (pid_ < 0) return absl::InternalError("fork failed");
  if (pid_ == 0) {
    dup2(in[0], 0);
    dup2(out[1], 1);
    if (arg.empty()) {
      execl(CKPT_TEST_PYTHON, CKPT_TEST_PYTHON, script.c_str(), static_cast<char*>(nullptr));
    } else {
      execl(CKPT_TEST_PYTHON, CKPT_TEST_PYTHON, script.c_str(), arg.c_str(), static_cast<char*>(nullptr));
    }
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  to_child_ = in[1];
  from_child_ = out[0];
  auto line = Command("", 60000);
  if (!line.ok()) return line.status();
  if (absl::StartsWith(*line, "error")) {
    return absl::FailedPreconditionError(absl::StrCat("moto server: ", *line));
  }
  endpoint_ = absl::StrCat("http://", *line);
  return absl::OkStatus();
}

absl::StatusOr<std::string> MotoServer::Command(const std::string& line, int timeout_ms) {
  if (!line.empty()) {
    const std::string text = line + "\n";
    if (write(to_child_, text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
      return absl::InternalError("moto server: write to its stdin failed");
    }
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    const size_t nl = pending_.find('\n');
    if (nl != std::string::npos) {
      std::string reply = pending_.substr(0, nl);
      pending_.erase(0, nl + 1);
      return reply;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      return absl::DeadlineExceededError(
          absl::StrCat("moto server: no answer in ", timeout_ms, " ms to \"", line, "\""));
    }
    pollfd p{from_child_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    char buf[4096];
    const ssize_t n = read(from_child_, buf, sizeof(buf));
    if (n <= 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "moto server exited (is moto installed? tools/setup.sh --deps-only installs it: ",
          CKPT_TEST_PYTHON, " -m pip install 'moto[server]' boto3)"));
    }
    pending_.append(buf, n);
  }
}

absl::Status MotoServer::CreateBucket(const std::string& name) {
  auto reply = Command(absl::StrCat("bucket ", name), 30000);
  if (!reply.ok()) return reply.status();
  if (*reply != "ok") return absl::InternalError(absl::StrCat("moto create bucket: ", *reply));
  return absl::OkStatus();
}

ObjectStoreOptions MotoServer::Options() const {
  ObjectStoreOptions o;
  o.endpoint = endpoint_;
  o.region = "us-east-1";
  o.credentials = ObjectCredentials{"testing", "testing", ""};
  o.path_style = true;
  o.initial_backoff_ms = 5;
  o.max_backoff_ms = 50;
  return o;
}

void MotoServer::ExportEnvironment() const {
  setenv("AWS_ENDPOINT_URL", endpoint_.c_str(), 1);
  setenv("AWS_ACCESS_KEY_ID", "testing", 1);
  setenv("AWS_SECRET_ACCESS_KEY", "testing", 1);
  setenv("AWS_REGION", "us-east-1", 1);
  unsetenv("AWS_SESSION_TOKEN");
  unsetenv("AWS_PROFILE");
  unsetenv("AWS_ENDPOINT_URL_S3");
}

MotoServer& SharedMotoServer() {
  static MotoServer* server = [] {
    auto* s = new MotoServer();
    absl::Status started = s->Start();
    if (!started.ok()) {
      ADD_FAILURE() << started;
      // The tests that need it fail on their first request.
    }
    return s;
  }();
  return *server;
}

std::string NewTestBucket() {
  static std::atomic<int> counter{0};
  std::string name = absl::StrCat("ckpt-test-", getpid(), "-", counter++);
  absl::Status created = SharedMotoServer().CreateBucket(name);
  EXPECT_TRUE(created.ok()) << created;
  return name;
}

}  // namespace ckpt::testing
