#include "restore/import_dcp.h"

#include <spawn.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "restore/commands.h"

extern char** environ;

namespace ckpt::tools {

int RunImportDcp(const std::string& root, const std::string& dcp_dir, int64_t step,
                 std::ostream& err) {
  const char* python_env = std::getenv("CKPT_PYTHON");
  const std::string python = python_env != nullptr && *python_env != '\0' ? python_env : "python3";
  const std::string step_text = std::to_string(step);
  std::vector<std::string> args = {python, "-m", "ckpt.dcp", "import", dcp_dir, root, step_text};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int spawned = posix_spawnp(&pid, python.c_str(), nullptr, nullptr, argv.data(), environ);
  if (spawned != 0) {
    err << kToolName << ": --import-dcp: cannot run " << python << ": " << std::strerror(spawned)
        << " (set CKPT_PYTHON to the python3 that has the ckpt package)\n";
    return kExitError;
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) {
      err << kToolName << ": --import-dcp: waiting for " << python << ": " << std::strerror(errno) << "\n";
      return kExitError;
    }
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return kExitOk;
  if (WIFEXITED(status) && WEXITSTATUS(status) == 1) {
    err << kToolName << ": --import-dcp: " << dcp_dir << " was not imported (the reason is above)\n";
    return kExitDataLoss;
  }
  err << kToolName << ": --import-dcp: " << python << " -m ckpt.dcp failed ("
      << (WIFEXITED(status) ? "exit code " + std::to_string(WEXITSTATUS(status))
                            : "signal " + std::to_string(WTERMSIG(status)))
      << "); is the ckpt package importable by it? (set CKPT_PYTHON)\n";
  return kExitError;
}

}  // namespace ckpt::tools
