// The conformance suite (file_system_conformance.h) against every FileSystem
// of the library: the POSIX file system, and the fault-injecting one (no
// faults armed) over it, each with io_uring and the thread pool, buffered
// and O_DIRECT.
#include <memory>
#include <string>

#include "ckpt/file_system.h"
#include "ckpt/file_system_wrapper.h"
#include "file_system_conformance.h"
#include "absl/strings/match.h"
#include "gtest/gtest-spi.h"
#include "gtest/gtest.h"
#include "testing/fault_injection_file_system.h"

namespace ckpt {
namespace {

struct FsParam {
  std::string name;
  FileSystemFactory factory;
  ConformanceConfig config;
};

void PrintTo(const FsParam& param, std::ostream* os) { *os << param.name; }

std::vector<FsParam> AllParams() {
  const std::pair<const char*, FileSystemFactory> file_systems[] = {
      {"Posix", [] { return PosixFileSystem(); }},
      {"FaultInjection",
       [] { return std::make_shared<testing::FaultInjectionFileSystem>(PosixFileSystem()); }},
      // The forwarding base alone must change nothing.
      {"Wrapper", [] { return std::make_shared<FileSystemWrapper>(PosixFileSystem()); }},
  };
  std::vector<FsParam> params;
  for (const auto& [name, factory] : file_systems) {
    for (const ConformanceConfig& config : AllConformanceConfigs()) {
      params.push_back(FsParam{name + config.name, factory, config});
    }
  }
  return params;
}

class FileSystemConformanceTest : public ::testing::TestWithParam<FsParam> {};

TEST_P(FileSystemConformanceTest, EveryCasePasses) {
  EXPECT_TRUE(RunFileSystemConformance(GetParam().factory, GetParam().config));
}

TEST(FileSystemConformanceSuiteTest, HasItsCasesAndFailsABrokenFileSystem) {
  EXPECT_GE(ConformanceCaseNames().size(), 26u);
  // A file system whose SyncDir claims success for a missing directory
  // breaks the contract: the suite must say so.
  class LyingSyncDir final : public FileSystemWrapper {
   public:
    using FileSystemWrapper::FileSystemWrapper;
    absl::Status SyncDir(const std::string& path) override { return absl::OkStatus(); }
  };
  ::testing::TestPartResultArray failures;
  bool passed = true;
  {
    ::testing::ScopedFakeTestPartResultReporter capture(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ALL_THREADS, &failures);
    passed = RunFileSystemConformance([] { return std::make_shared<LyingSyncDir>(PosixFileSystem()); },
                                      AllConformanceConfigs()[2]);
  }
  EXPECT_FALSE(passed);
  ASSERT_GT(failures.size(), 0);
  for (int i = 0; i < failures.size(); ++i) {
    EXPECT_TRUE(absl::StrContains(failures.GetTestPartResult(i).message(),
                                  "SyncDirSyncsDirectoriesAndNamesMissingOnes [ThreadsBuffered]"))
        << failures.GetTestPartResult(i).message();
  }
}

INSTANTIATE_TEST_SUITE_P(AllFileSystems, FileSystemConformanceTest, ::testing::ValuesIn(AllParams()),
                         [](const ::testing::TestParamInfo<FsParam>& info) { return info.param.name; });

}  // namespace
}  // namespace ckpt
