// The FileSystem conformance suite, callable with a factory: what the engine
// relies on from the seam (ckpt/file_system.h), pinned down once for every
// implementation. A new backend proves itself with one call in a test:
//
//   TEST(MyFileSystemTest, Conforms) {
//     EXPECT_TRUE(RunFileSystemConformance([] { return MyFileSystem(); }));
//   }
//
// Each case runs in a fresh scratch directory (TEST_TMPDIR) with a fresh
// file system from the factory, once per configuration: io_uring and the
// thread pool, buffered and O_DIRECT. A configuration the file system
// refuses (an I/O queue kind kUnavailable, O_DIRECT refused at open) or a
// call it may leave kUnimplemented (Allocate, Exchange) is skipped with a
// note on stdout; every failure is the calling test's, naming the case and
// the configuration.
#ifndef CKPT_TESTS_FILE_SYSTEM_CONFORMANCE_H_
#define CKPT_TESTS_FILE_SYSTEM_CONFORMANCE_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/file_system.h"

namespace ckpt {

using FileSystemFactory = std::function<std::shared_ptr<FileSystem>()>;

struct ConformanceConfig {
  std::string name;  // "UringBuffered", "ThreadsDirect", ...
  IoQueueKind kind = IoQueueKind::kThreads;
  bool direct = false;
};

// The four configurations `RunFileSystemConformance(factory)` runs.
std::vector<ConformanceConfig> AllConformanceConfigs();

// The suite's cases, by name.
std::vector<std::string> ConformanceCaseNames();

// Runs every case in every configuration (or in `config`); true when none
// failed.
bool RunFileSystemConformance(const FileSystemFactory& factory);
bool RunFileSystemConformance(const FileSystemFactory& factory, const ConformanceConfig& config);

}  // namespace ckpt

#endif  // CKPT_TESTS_FILE_SYSTEM_CONFORMANCE_H_
