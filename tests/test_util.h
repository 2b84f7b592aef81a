// Shared helpers for ckpt's tests: scratch directories and random tensors.
#ifndef CKPT_TESTS_TEST_UTIL_H_
#define CKPT_TESTS_TEST_UTIL_H_

#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "ckpt/engine.h"
#include "ckpt/options.h"
#include "ckpt/tensor.h"

namespace ckpt::testing {

// `ScratchDir` is a fresh directory under $TEST_TMPDIR (or /tmp on the same
// disk as the build when unset), removed with everything in it on
// destruction unless CKPT_TEST_KEEP=1.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& prefix = "ckpt-test");
  // Under `base` instead ("" keeps the default above).
  ScratchDir(const std::string& prefix, const std::string& base);
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::string& path() const { return path_; }
  std::string Join(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// An owned tensor with deterministic pseudo-random contents.
struct OwnedTensor {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;

  TensorView view() const { return TensorView{name, dtype, shape, bytes.data(), bytes.size()}; }
};

// Whether the n bytes at a and b are equal. Unlike memcmp, defined for n == 0
// with null pointers (the data of an empty vector or a zero-byte tensor).
inline bool SameBytes(const void* a, const void* b, size_t n) {
  return n == 0 || std::memcmp(a, b, n) == 0;
}

// Fills `bytes` with pseudo-random bytes from `seed`.
void FillRandom(std::vector<uint8_t>& bytes, uint64_t seed);
OwnedTensor RandomTensor(const std::string& name, DType dtype, std::vector<int64_t> shape,
                         uint64_t seed);
std::vector<TensorView> Views(const std::vector<OwnedTensor>& tensors);

// A save's kind for messages: "full", "delta", or "none" before it commits.
std::string KindName(const std::optional<CheckpointKind>& kind);

// Engine options with 64 KiB chunks and small shards, so that small test
// states still span many chunks, shards and I/O operations.
EngineOptions SmallChunks();

// Reads step `step` of `root` back and expects exactly `want`: the same
// tensors, every byte, every stored checksum, and `Verify()` passing.
void ExpectCheckpointEquals(const std::string& root, int64_t step,
                            const std::vector<OwnedTensor>& want);

// A save that hangs is worse than one that fails: these wait at most
// `deadline`, then print `what` and abort the test binary (a hung engine
// thread cannot be stopped, so failing fast is the only way not to hang CI).
absl::Status WaitOrDie(SaveHandle& handle, absl::Duration deadline, const std::string& what);
absl::Status WaitStagedOrDie(SaveHandle& handle, absl::Duration deadline, const std::string& what);
// Runs `fn` (e.g. a `SaveAsync` that may block) under the same deadline.
void RunOrDie(const std::function<void()>& fn, absl::Duration deadline, const std::string& what);

// Whether every case must run (CKPT_TEST_REQUIRE_ALL=1, set by
// `tools/test.sh --full`): then what this machine should have (io_uring,
// root, a loop device) is no reason to skip.
bool EverythingRequired();

// Skips the running test because this machine lacks something -- or, under
// `tools/test.sh --full`, fails it naming what is missing. Use only in a
// function returning void (a TEST body, SetUp).
#define CKPT_SKIP_UNLESS_REQUIRED(why)                                                       \
  do {                                                                                       \
    const std::string ckpt_missing_ = (why);                                                 \
    if (::ckpt::testing::EverythingRequired()) {                                             \
      FAIL() << "tools/test.sh --full requires what this machine lacks: " << ckpt_missing_;  \
    }                                                                                        \
    GTEST_SKIP() << ckpt_missing_;                                                           \
  } while (0)

// Where fault sweeps put their roots: "" ($TEST_TMPDIR or the default) when
// TEST_TMPDIR is set, else /dev/shm when writable. Durability is modelled by
// `FaultInjectionFileSystem`, so a real disk's fsyncs and inode churn only
// cost time over hundreds of runs.
std::string SweepScratchBase();

// The name of `root`'s temp directory of a save of `step` once a file in it
// holds data (proof that the save is being written and has not committed),
// polled until `deadline`; "" if none did by then.
std::string AwaitWrittenTempDir(const std::string& root, int64_t step, absl::Duration deadline);

// Removes `path` recursively (best effort).
void RemoveTree(const std::string& path);

// A whole file's bytes ("" if it cannot be read), and a file written whole
// (created or truncated).
std::string ReadText(const std::string& path);
void WriteText(const std::string& path, const std::string& text);

// True for the lock files of a root (ckpt/root_lock.h): engines and
// retention jobs leave them by design.
bool IsRootLockFile(const std::string& name);
// Entries of `root` other than LATEST, committed checkpoint directories and
// lock files: what no operation, failed or not, may leave behind.
std::vector<std::string> Leftovers(const std::string& root);

// What a restore of one step yields: its extras and, per tensor, its bytes
// and error bound.
struct RestoredStep {
  std::string extras;
  std::map<std::string, std::string> bytes;
  std::map<std::string, double> bounds;
};
// Reads (and verifies) every step of `root` into `out`: "" on success, else
// what failed.
std::string ReadAllSteps(const std::string& root, std::map<int64_t, RestoredStep>* out);
// "" if `root` holds exactly the steps of `want`, each restoring exactly as
// recorded there (bytes, error bounds, extras); else the first difference.
std::string DiffSteps(const std::string& root, const std::map<int64_t, RestoredStep>& want);

// "" if `got`, restored from a top-k delta of `want` taken against `base`
// (what a restore of the delta's base yields), is what top-k keeps -- judged
// from the values alone, not from the bound the engine recorded: every
// element is `want`'s or `base`'s bit for bit, at least k =
// ceil(ratio * numel) changed elements (all, if fewer changed) are `want`'s,
// and no dropped change exceeds a kept one or is non-finite. Else what is
// wrong. `*error` gets max |got - want| (0 when nothing was dropped).
// Floating dtypes fp32, fp64 and bf16; any other dtype must restore exactly.
std::string TopKRestoreProblem(DType dtype, const std::string& want, const std::string& got,
                               const std::string& base, double ratio, double* error);

// "" if `restored` (as ReadAllSteps gives it) holds the values the test
// saved (`saved`: step -> tensors): bit for bit where the step recorded no
// error bound; where it did (a top-k delta, chained: its base is the step
// before in `saved`, as restored) by TopKRestoreProblem with `topk_ratio`,
// its error within the recorded bound. Else the first difference.
std::string DiffFromSaved(const std::map<int64_t, RestoredStep>& restored,
                          const std::map<int64_t, std::vector<OwnedTensor>>& saved,
                          double topk_ratio = 0);

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_TEST_UTIL_H_
