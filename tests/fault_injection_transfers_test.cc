// `FaultInjectionFileSystem` on the synchronous transfers, `File::ReadAt`
// and `File::WriteAt`: each call counts once; kEio, kEnospc and kCrash fail
// it before anything reaches the disk; kShortTransfer and kEintr are retried
// inside the call; bytes written and not synced are lost in a power loss,
// as those of `IoOp`s are; a slow or hung disk slows or holds them too.
#include <atomic>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "ckpt/file_system.h"
#include "ckpt/tensor.h"
#include "gtest/gtest.h"
#include "test_util.h"
#include "testing/fault_injection_file_system.h"

namespace ckpt {
namespace {

using testing::Fault;
using testing::FaultInjectionFileSystem;
using testing::ScratchDir;

class FaultInjectionTransfersTest : public ::testing::Test {
 protected:
  std::string Path(const std::string& name) const { return dir_.Join(name); }
  void Arm(Fault fault) { fs_->FailAt(fs_->call_count() + 1, fault); }

  std::unique_ptr<File> Create(const std::string& name, bool direct = false) {
    OpenOptions options;
    options.write = options.create = true;
    options.direct = direct;
    auto file = fs_->Open(Path(name), options);
    if (!file.ok()) {
      status_ = file.status();
      return nullptr;
    }
    return std::move(*file);
  }
  std::unique_ptr<File> CreateOrDie(const std::string& name) {
    auto file = Create(name);
    EXPECT_NE(file, nullptr) << status_;
    return file;
  }

  std::string Contents(const std::string& name) {
    std::ifstream f(Path(name), std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  }
  static std::span<const char> Bytes(const std::string& s) { return {s.data(), s.size()}; }

  ScratchDir dir_{"ckpt-fault-transfers"};
  std::shared_ptr<FaultInjectionFileSystem> fs_ =
      std::make_shared<FaultInjectionFileSystem>(PosixFileSystem());
  absl::Status status_;
};

TEST_F(FaultInjectionTransfersTest, EachReadAtAndWriteAtCountsOnce) {
  fs_->RecordCalls(true);
  auto file = CreateOrDie("f");
  ASSERT_NE(file, nullptr);
  const std::string big(3 << 20, 'x');  // larger than any queue piece
  ASSERT_TRUE(file->WriteAt(0, Bytes(big)).ok());
  std::string back(big.size(), '\0');
  auto read = file->ReadAt(0, std::span<char>(back));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, big.size());
  EXPECT_EQ(fs_->call_count(), 3u);  // open, WriteAt, ReadAt
  const std::vector<std::string> calls = fs_->recorded_calls();
  ASSERT_EQ(calls.size(), 3u);
  EXPECT_EQ(calls[1], absl::StrCat("WriteAt ", Path("f"), "@0+", big.size()));
  EXPECT_EQ(calls[2], absl::StrCat("ReadAt ", Path("f"), "@0+", big.size()));
  EXPECT_FALSE(testing::IsTransferCall(calls[0]));
  EXPECT_TRUE(testing::IsTransferCall(calls[1]));
  EXPECT_TRUE(testing::IsTransferCall(calls[2]));
  EXPECT_TRUE(testing::IsTransferCall("IoOp write /f@0+10"));
}

TEST_F(FaultInjectionTransfersTest, EioAndEnospcFailTheCallNamingThePathAndWriteNothing) {
  auto file = CreateOrDie("f");
  ASSERT_NE(file, nullptr);
  for (auto [fault, code] : {std::pair{Fault::kEio, absl::StatusCode::kInternal},
                             std::pair{Fault::kEnospc, absl::StatusCode::kResourceExhausted}}) {
    SCOPED_TRACE(testing::FaultName(fault));
    Arm(fault);
    absl::Status written = file->WriteAt(0, Bytes("hello"));
    EXPECT_EQ(written.code(), code) << written;
    EXPECT_TRUE(absl::StrContains(written.message(), Path("f"))) << written;
    EXPECT_EQ(std::filesystem::file_size(Path("f")), 0u);  // nothing reached the disk
  }
  ASSERT_TRUE(file->WriteAt(0, Bytes("hello")).ok());  // only the armed call fails
  Arm(Fault::kEio);
  char buf[5];
  auto read = file->ReadAt(0, buf);
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInternal) << read.status();
  EXPECT_TRUE(absl::StrContains(read.status().message(), Path("f"))) << read.status();
  EXPECT_EQ(fs_->injected_count(), 3u);
  EXPECT_TRUE(absl::StartsWith(fs_->first_injected_call(), "WriteAt " + Path("f")))
      << fs_->first_injected_call();
}

TEST_F(FaultInjectionTransfersTest, ShortTransferAndEintrAreRetriedInsideTheCall) {
  auto file = CreateOrDie("f");
  ASSERT_NE(file, nullptr);
  std::string data(10000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>('a' + i % 26);
  for (Fault fault : {Fault::kShortTransfer, Fault::kEintr}) {
    SCOPED_TRACE(testing::FaultName(fault));
    const uint64_t injected = fs_->injected_count();
    Arm(fault);
    ASSERT_TRUE(file->WriteAt(0, Bytes(data)).ok());
    EXPECT_EQ(Contents("f"), data);
    Arm(fault);
    std::string back(data.size(), '\0');
    auto read = file->ReadAt(0, std::span<char>(back));
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(*read, data.size());
    EXPECT_EQ(back, data);
    EXPECT_EQ(fs_->injected_count(), injected + 2);  // injected, and absorbed
  }
  // A short read that meets the end of the file stops there.
  Arm(Fault::kShortTransfer);
  std::string more(3 * data.size(), '\0');
  auto read = file->ReadAt(0, std::span<char>(more));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, data.size());
  Arm(Fault::kShortTransfer);  // one byte cannot be cut: retried as EINTR
  ASSERT_TRUE(file->WriteAt(data.size(), Bytes("!")).ok());
  EXPECT_EQ(Contents("f"), data + "!");
}

TEST_F(FaultInjectionTransfersTest, ShortTransferOfDirectFileKeepsBlocksWhole) {
  auto file = Create("direct", /*direct=*/true);
  if (file == nullptr && status_.code() == absl::StatusCode::kInvalidArgument) {
    GTEST_SKIP() << "no O_DIRECT here: " << status_;
  }
  ASSERT_NE(file, nullptr) << status_;
  auto block = AlignedBytes::Allocate(3 * kDirectIoAlignment, true);
  ASSERT_TRUE(block.ok());
  std::span<char> bytes(static_cast<char*>(block->data()), 3 * kDirectIoAlignment);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7);
  const std::string expected(bytes.begin(), bytes.end());
  Arm(Fault::kShortTransfer);
  ASSERT_TRUE(file->WriteAt(0, bytes).ok());  // a misaligned part would fail EINVAL
  auto back = AlignedBytes::Allocate(3 * kDirectIoAlignment, true);
  ASSERT_TRUE(back.ok());
  std::span<char> out(static_cast<char*>(back->data()), 3 * kDirectIoAlignment);
  Arm(Fault::kShortTransfer);
  auto read = file->ReadAt(0, out);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, out.size());
  EXPECT_EQ(std::string(out.begin(), out.end()), expected);
  EXPECT_EQ(fs_->injected_count(), 2u);
}

TEST_F(FaultInjectionTransfersTest, CrashFailsTheCallAndEveryLaterOne) {
  auto file = CreateOrDie("f");
  ASSERT_NE(file, nullptr);
  Arm(Fault::kCrash);
  absl::Status written = file->WriteAt(0, Bytes("lost"));
  EXPECT_EQ(written.code(), absl::StatusCode::kAborted) << written;
  EXPECT_TRUE(absl::StrContains(written.message(), "simulated crash")) << written;
  EXPECT_TRUE(fs_->crashed());
  EXPECT_EQ(std::filesystem::file_size(Path("f")), 0u);
  char buf[4];
  EXPECT_EQ(file->ReadAt(0, buf).status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(file->WriteAt(0, Bytes("more")).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(std::filesystem::file_size(Path("f")), 0u);
  EXPECT_EQ(fs_->injected_count(), 3u);
}

TEST_F(FaultInjectionTransfersTest, PowerLossDropsWhatWriteAtWroteAfterTheLastSync) {
  {
    auto file = CreateOrDie("f");
    ASSERT_NE(file, nullptr);
    ASSERT_TRUE(file->WriteAt(0, Bytes("0123456789")).ok());
    ASSERT_TRUE(file->Sync().ok());
    ASSERT_TRUE(file->WriteAt(10, Bytes("tail")).ok());  // never synced
    ASSERT_TRUE(file->WriteAt(0, Bytes("ab")).ok());     // in place: not rolled back
    ASSERT_TRUE(file->Close().ok());
  }
  {
    auto never = CreateOrDie("never");
    ASSERT_NE(never, nullptr);
    ASSERT_TRUE(never->WriteAt(0, Bytes("abc")).ok());
    ASSERT_TRUE(never->Close().ok());
  }
  ASSERT_TRUE(fs_->SyncDir(dir_.path()).ok());
  ASSERT_TRUE(fs_->DropUnsyncedData().ok());
  EXPECT_EQ(Contents("f"), "ab23456789");
  EXPECT_EQ(Contents("never"), "");
}

TEST_F(FaultInjectionTransfersTest, HeldDiskHoldsWriteAtAndSlowDiskSlowsReadAt) {
  auto file = CreateOrDie("f");
  ASSERT_NE(file, nullptr);
  fs_->HoldIo(true);
  std::atomic<bool> done{false};
  absl::Status written;
  std::thread writer([&] {
    written = file->WriteAt(0, Bytes("held"));
    done = true;
  });
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (fs_->io_held_waiters() == 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_EQ(fs_->io_held_waiters(), 1u);
  EXPECT_FALSE(done.load());
  fs_->HoldIo(false);
  testing::RunOrDie([&] { writer.join(); }, absl::Seconds(30), "the held WriteAt");
  EXPECT_TRUE(written.ok()) << written;
  EXPECT_EQ(Contents("f"), "held");

  fs_->SetIoDelay(absl::Milliseconds(30));
  char buf[4];
  const absl::Time start = absl::Now();
  auto read = file->ReadAt(0, buf);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(30));
}

}  // namespace
}  // namespace ckpt
