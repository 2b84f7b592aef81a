#include "test_util.h"

#include <xxhash.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ckpt/catalog.h"
#include "ckpt/reader.h"
#include "ckpt/root_lock.h"
#include "gtest/gtest.h"

#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <random>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace ckpt::testing {

ScratchDir::ScratchDir(const std::string& prefix) : ScratchDir(prefix, "") {}

ScratchDir::ScratchDir(const std::string& prefix, const std::string& base) {
  const char* env = getenv("TEST_TMPDIR");
  std::string dir = !base.empty() ? base : env != nullptr ? env : "/tmp";
  std::string templ = dir + "/" + prefix + "-XXXXXX";
  if (mkdtemp(templ.data()) == nullptr) throw std::runtime_error("mkdtemp failed: " + templ);
  path_ = templ;
}

ScratchDir::~ScratchDir() {
  const char* keep = getenv("CKPT_TEST_KEEP");
  if (keep != nullptr && std::string(keep) == "1") return;
  RemoveTree(path_);
}

EngineOptions SmallChunks() {
  EngineOptions options;
  options.io.chunk_bytes = 64 << 10;
  options.shard_min_bytes = 64 << 10;
  return options;
}

void ExpectCheckpointEquals(const std::string& root, int64_t step,
                            const std::vector<OwnedTensor>& want) {
  ReaderOptions options;
  options.step = step;
  auto reader = Reader::Open(root, options);
  ASSERT_TRUE(reader.ok()) << reader.status();
  ASSERT_TRUE((*reader)->Verify().ok());
  ASSERT_EQ((*reader)->tensors().size(), want.size());
  for (const OwnedTensor& t : want) {
    const TensorInfo* info = (*reader)->Find(t.name);
    ASSERT_NE(info, nullptr) << t.name;
    EXPECT_EQ(info->xxh3, XXH3_64bits(t.bytes.data(), t.bytes.size())) << t.name;
    auto got = (*reader)->Read(t.name);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->nbytes(), t.bytes.size()) << t.name;
    EXPECT_TRUE(SameBytes(got->data(), t.bytes.data(), t.bytes.size()))
        << t.name << " at step " << step;
  }
}

std::string ReadAllSteps(const std::string& root, std::map<int64_t, RestoredStep>* out) {
  auto steps = ListSteps(root);
  if (!steps.ok()) return steps.status().ToString();
  for (int64_t step : *steps) {
    ReaderOptions options;
    options.step = step;
    options.io.buffer_bytes = 1 << 20;
    auto reader = Reader::Open(root, options);
    if (!reader.ok()) return absl::StrCat("step ", step, ": ", reader.status().ToString());
    auto all = (*reader)->ReadAll();
    if (!all.ok()) return absl::StrCat("step ", step, ": ", all.status().ToString());
    RestoredStep& r = (*out)[step];
    r.extras = (*reader)->extras_json();
    for (const Tensor& t : *all) {
      r.bytes[t.name] = std::string(static_cast<const char*>(t.data()), t.nbytes());
      r.bounds[t.name] = (*reader)->Find(t.name)->error_bound;
    }
    absl::Status verified = (*reader)->Verify();
    if (!verified.ok()) return absl::StrCat("step ", step, ": ", verified.ToString());
  }
  return "";
}

std::string DiffSteps(const std::string& root, const std::map<int64_t, RestoredStep>& want) {
  std::map<int64_t, RestoredStep> got;
  std::string error = ReadAllSteps(root, &got);
  if (!error.empty()) return error;
  std::vector<int64_t> want_steps, got_steps;
  for (const auto& [step, r] : want) want_steps.push_back(step);
  for (const auto& [step, r] : got) got_steps.push_back(step);
  if (want_steps != got_steps) {
    return absl::StrCat(root, " holds steps [", absl::StrJoin(got_steps, ","), "], expected [",
                        absl::StrJoin(want_steps, ","), "]");
  }
  for (const auto& [step, r] : want) {
    const RestoredStep& g = got.at(step);
    if (g.bytes != r.bytes) return absl::StrCat("step ", step, " restores other values");
    if (g.bounds != r.bounds) return absl::StrCat("step ", step, " has other error bounds");
    if (g.extras != r.extras) return absl::StrCat("step ", step, " has other extras");
  }
  return "";
}

namespace {

// Element `i` of `bytes` (of `dtype`) as a double, and its bits.
double ElementValue(DType dtype, const std::string& bytes, size_t i) {
  const char* p = bytes.data();
  switch (dtype) {
    case DType::kFloat32: { float f; std::memcpy(&f, p + 4 * i, 4); return f; }
    case DType::kFloat64: { double d; std::memcpy(&d, p + 8 * i, 8); return d; }
    case DType::kBFloat16: {
      uint16_t h; std::memcpy(&h, p + 2 * i, 2);
      const uint32_t u = uint32_t{h} << 16;
      float f; std::memcpy(&f, &u, 4); return f;
    }
    default: return 0;
  }
}

bool SameElement(const std::string& a, const std::string& b, size_t i, size_t width) {
  return std::memcmp(a.data() + i * width, b.data() + i * width, width) == 0;
}

}  // namespace

std::string TopKRestoreProblem(DType dtype, const std::string& want, const std::string& got,
                               const std::string& base, double ratio, double* error) {
  *error = 0;
  if (got.size() != want.size() || base.size() != want.size()) return "sizes differ";
  const size_t width = dtype == DType::kFloat32 ? 4 : dtype == DType::kFloat64 ? 8
                       : dtype == DType::kBFloat16 ? 2 : 0;
  if (width == 0) return got == want ? "" : "a tensor of a dtype top-k never drops from differs";
  const size_t n = want.size() / width;
  size_t changed = 0, kept = 0;
  double largest_dropped = 0, smallest_kept = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < n; ++i) {
    const bool is_want = SameElement(got, want, i, width), is_base = SameElement(got, base, i, width);
    if (!is_want && !is_base) return absl::StrCat("element ", i, " is neither the saved nor the base's");
    if (SameElement(want, base, i, width)) continue;
    ++changed;
    const double change = std::fabs(ElementValue(dtype, want, i) - ElementValue(dtype, base, i));
    if (is_want) {
      ++kept;
      if (std::isfinite(change)) smallest_kept = std::min(smallest_kept, change);
    } else {
      if (!std::isfinite(change)) return absl::StrCat("element ", i, ": a non-finite change was dropped");
      largest_dropped = std::max(largest_dropped, change);
    }
  }
  const size_t k = static_cast<size_t>(std::ceil(ratio * static_cast<double>(n)));
  if (kept < std::min(k, changed)) return absl::StrCat(kept, " changes kept; top-k keeps ", k, " of ", changed);
  if (kept < changed && largest_dropped > smallest_kept) {
    return absl::StrCat("dropped a change of ", largest_dropped, " but kept one of ", smallest_kept);
  }
  *error = largest_dropped;
  return "";
}

std::string DiffFromSaved(const std::map<int64_t, RestoredStep>& restored,
                          const std::map<int64_t, std::vector<OwnedTensor>>& saved, double topk_ratio) {
  const RestoredStep* previous = nullptr;
  for (const auto& [step, tensors] : saved) {
    auto it = restored.find(step);
    if (it == restored.end()) return absl::StrCat("step ", step, " was not restored");
    const RestoredStep& r = it->second;
    if (r.bytes.size() != tensors.size()) return absl::StrCat("step ", step, " restores other tensors");
    for (const OwnedTensor& t : tensors) {
      auto got = r.bytes.find(t.name);
      if (got == r.bytes.end()) return absl::StrCat("step ", step, ": ", t.name, " is missing");
      const std::string want(t.bytes.begin(), t.bytes.end());
      const double bound = r.bounds.count(t.name) ? r.bounds.at(t.name) : 0;
      if (bound == 0) {
        if (got->second != want) return absl::StrCat("step ", step, ": ", t.name, " is not what was saved");
        continue;
      }
      if (topk_ratio <= 0 || previous == nullptr) {
        return absl::StrCat("step ", step, ": ", t.name, " is lossy (bound ", bound, ") where nothing may be");
      }
      double error = 0;
      std::string problem = TopKRestoreProblem(t.dtype, want, got->second, previous->bytes.at(t.name),
                                               topk_ratio, &error);
      if (!problem.empty()) return absl::StrCat("step ", step, ": ", t.name, ": ", problem);
      if (error > bound * (1 + 1e-6)) {
        return absl::StrCat("step ", step, ": ", t.name, ": error ", error, " over the recorded bound ", bound);
      }
    }
    previous = &r;
  }
  return "";
}

bool EverythingRequired() {
  const char* all = getenv("CKPT_TEST_REQUIRE_ALL");
  return all != nullptr && std::string(all) == "1";
}

std::string SweepScratchBase() {
  if (getenv("TEST_TMPDIR") != nullptr) return "";
  std::error_code ec;
  return std::filesystem::is_directory("/dev/shm", ec) && access("/dev/shm", W_OK) == 0 ? "/dev/shm"
                                                                                          : "";
}

std::string AwaitWrittenTempDir(const std::string& root, int64_t step, absl::Duration deadline) {
  const std::string prefix = ".tmp-" + StepDirName(step);
  const absl::Time until = absl::Now() + deadline;
  while (true) {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(root, ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind(prefix, 0) != 0) continue;
      for (const auto& f : std::filesystem::directory_iterator(e.path(), ec)) {
        if (f.is_regular_file(ec) && f.file_size(ec) > 0) return name;
      }
    }
    if (absl::Now() >= until) return "";
    absl::SleepFor(absl::Milliseconds(5));
  }
}

void RemoveTree(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
}

bool IsRootLockFile(const std::string& name) {
  return name == RootLockFileName(RootLockKind::kWriter) ||
         name == RootLockFileName(RootLockKind::kRetention);
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

std::vector<std::string> Leftovers(const std::string& root) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(root)) {
    const std::string name = entry.path().filename().string();
    if (name != "LATEST" && name.rfind("step-", 0) != 0 && !IsRootLockFile(name)) {
      names.push_back(name);
    }
  }
  return names;
}

void FillRandom(std::vector<uint8_t>& bytes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  size_t i = 0;
  for (; i + 8 <= bytes.size(); i += 8) {
    uint64_t v = rng();
    for (int b = 0; b < 8; ++b) bytes[i + b] = static_cast<uint8_t>(v >> (8 * b));
  }
  uint64_t v = rng();
  for (; i < bytes.size(); ++i, v >>= 8) bytes[i] = static_cast<uint8_t>(v);
}

OwnedTensor RandomTensor(const std::string& name, DType dtype, std::vector<int64_t> shape,
                         uint64_t seed) {
  OwnedTensor t{name, dtype, std::move(shape), {}};
  uint64_t n = 1;
  for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
  t.bytes.resize(n * DTypeSize(dtype));
  FillRandom(t.bytes, seed);
  if (dtype == DType::kBool) {
    for (auto& b : t.bytes) b &= 1;
  }
  return t;
}

std::string KindName(const std::optional<CheckpointKind>& kind) {
  return kind.has_value() ? std::string(CheckpointKindName(*kind)) : "none";
}

std::vector<TensorView> Views(const std::vector<OwnedTensor>& tensors) {
  std::vector<TensorView> views;
  views.reserve(tensors.size());
  for (const auto& t : tensors) views.push_back(t.view());
  return views;
}

void RunOrDie(const std::function<void()>& fn, absl::Duration deadline, const std::string& what) {
  std::promise<void> done;
  std::future<void> finished = done.get_future();
  std::thread runner([&fn, &done] {
    fn();
    done.set_value();
  });
  if (finished.wait_for(absl::ToChronoNanoseconds(deadline)) != std::future_status::ready) {
    std::fprintf(stderr, "\nFATAL: %s did not finish within %s (a hang); aborting the test binary\n",
                 what.c_str(), absl::FormatDuration(deadline).c_str());
    std::fflush(stderr);
    std::abort();
  }
  runner.join();
}

absl::Status WaitOrDie(SaveHandle& handle, absl::Duration deadline, const std::string& what) {
  absl::Status status;
  RunOrDie([&] { status = handle.Wait(); }, deadline, what);
  return status;
}

absl::Status WaitStagedOrDie(SaveHandle& handle, absl::Duration deadline, const std::string& what) {
  absl::Status status;
  RunOrDie([&] { status = handle.WaitStaged(); }, deadline, what);
  return status;
}

}  // namespace ckpt::testing
