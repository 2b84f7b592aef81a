// MotoServer: moto's S3 server (tests/object_store/s3_server.py) in a child
// process on 127.0.0.1, for the object-tier tests. A missing moto is a test
// failure, never a skip.
#ifndef CKPT_TESTS_MOTO_SERVER_H_
#define CKPT_TESTS_MOTO_SERVER_H_

#include <sys/types.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckpt/object_store.h"

namespace ckpt::testing {

class MotoServer {
 public:
  MotoServer() = default;
  ~MotoServer();  // stops the server
  MotoServer(const MotoServer&) = delete;
  MotoServer& operator=(const MotoServer&) = delete;

  // Starts the server; waits up to 60 s for it to listen.
  absl::Status Start();
  // Starts tests/object_store/`script` with `arg` instead (the fault proxy).
  absl::Status StartScript(const std::string& script, const std::string& arg);
  // Sends one command line; returns the reply line (waits up to 30 s).
  absl::StatusOr<std::string> Send(const std::string& line) { return Command(line, 30000); }
  // "http://127.0.0.1:PORT".
  const std::string& endpoint() const { return endpoint_; }
  // Creates bucket `name` (waits up to 30 s).
  absl::Status CreateBucket(const std::string& name);
  // Options that reach this server with dummy credentials, path-style.
  ObjectStoreOptions Options() const;
  // Sets AWS_ENDPOINT_URL and dummy AWS_* credentials in this process's
  // environment, for code that opens s3:// roots by itself (the tools).
  void ExportEnvironment() const;

 private:
  absl::StatusOr<std::string> Command(const std::string& line, int timeout_ms);

  pid_t pid_ = -1;
  int to_child_ = -1;
  int from_child_ = -1;
  std::string pending_;
  std::string endpoint_;
};

// The fault proxy (tests/object_store/fault_proxy.py) in front of `upstream`:
//   proxy.Send("fault reset 1 GET")
class FaultProxy : public MotoServer {
 public:
  absl::Status Start(const std::string& upstream) { return StartScript("fault_proxy.py", upstream); }
};

// One server for a whole test binary, started on first use.
MotoServer& SharedMotoServer();
// A fresh bucket on the shared server (a unique name per call).
std::string NewTestBucket();

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_MOTO_SERVER_H_
