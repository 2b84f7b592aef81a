// gpu_bench: how long `SaveAsync` holds a training loop whose state lives in
// GPU memory, next to the floor: a plain device->host copy of the same bytes
// into page-locked memory.
//
// Allocates --tensors device tensors (varied sizes, --bytes in all), then:
//   d2h:  cudaMemcpyAsync of every tensor into one cudaMallocHost buffer on a
//         non-blocking stream, then cudaStreamSynchronize; best of --reps
//         after a warm-up.
//   save: engines on fresh roots under --dir, each save waited for and
//         removed: (1) no size hint: the first save, which grows the pool
//         unpinned; (2) `staging_reserve_bytes` = the state's size, waited
//         until pinned (`reserve_s`, off the caller's thread): the first
//         save, then --reps saves (`SaveAsync`, eager or lazy + `WaitStaged`
//         with --lazy); (3) the same lazily staged: what `SaveAsync` alone
//         holds (`lazy_blocked_s`).
// Prints one JSON line {"bench": "gpu_save", ...}: medians over the reps;
// blocked_over_d2h = blocked_s / d2h_memcpy_s (1.0 would mean staging costs
// the training loop nothing beyond the copy itself); first_over_steady =
// the first (reserved) save's blocked time over a steady one's. Without a CUDA device it
// prints {"bench": "gpu_save", "skipped": "no CUDA device"} and exits 0.
// Progress goes to stderr.

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "ckpt/engine.h"
#include "ckpt/tensor.h"
#include "nlohmann/json.hpp"

#ifdef CKPT_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

ABSL_FLAG(std::string, dir, "", "Directory to write checkpoints under (default: $TMPDIR or /tmp).");
ABSL_FLAG(uint64_t, bytes, uint64_t{1200} << 20, "Total bytes of device tensors.");
ABSL_FLAG(int, tensors, 150, "Number of device tensors.");
ABSL_FLAG(int, reps, 3, "Measured saves (and D2H copies); medians reported.");
ABSL_FLAG(bool, lazy, false, "EngineOptions::lazy_staging: time SaveAsync + WaitStaged.");
ABSL_FLAG(uint64_t, chunk_bytes, uint64_t{1} << 20, "IoOptions.chunk_bytes.");
ABSL_FLAG(int, device, 0, "CUDA device to allocate the tensors on.");

namespace {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::ordered_json;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}
double Round4(double x) { return std::round(x * 10000) / 10000; }
double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}
void Log(const std::string& line) { std::cerr << "[gpu_bench] " << line << std::endl; }

Json Skipped(const std::string& why) {
  Json j;
  j["bench"] = "gpu_save";
  j["skipped"] = "no CUDA device";
  j["why"] = why;
  return j;
}

#ifdef CKPT_HAVE_CUDA

[[noreturn]] void Die(const std::string& line) {
  Log("FATAL: " + line);
  std::exit(1);
}

void CheckCuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) Die(absl::StrCat(what, ": ", cudaGetErrorString(err)));
}

// Sizes of `count` tensors summing to `total`, multiples of 256 bytes, in a
// transformer-like mix: a few large, many middling, some small.
std::vector<size_t> TensorSizes(uint64_t total, int count) {
  std::vector<double> weight(count);
  for (int i = 0; i < count; ++i) {
    weight[i] = i % 10 == 0 ? 8.0 : i % 3 == 0 ? 0.05 : 1.0;
  }
  double sum = 0;
  for (double w : weight) sum += w;
  std::vector<size_t> sizes(count);
  uint64_t used = 0;
  for (int i = 0; i < count; ++i) {
    sizes[i] = std::max<size_t>(256, static_cast<size_t>(total * weight[i] / sum) / 256 * 256);
    used += sizes[i];
  }
  if (used < total) sizes[0] += total - used;  // the remainder goes to the first (large) tensor
  return sizes;
}

// What `MeasureSaves` saw.
struct SaveRun {
  double reserve_s = 0;            // Open to the reserved pool being pinned
  double first_blocked_s = 0;      // the first save's caller (SaveAsync, + WaitStaged if lazy)
  std::string first_memory;        // the staging memory the first save used
  std::vector<double> returned;    // SaveAsync alone, steady saves
  std::vector<double> blocked;     // SaveAsync (+ WaitStaged), steady saves
  std::vector<double> staging, persist_gbps, seconds;
  std::string memory, backend;
};

// Opens an engine on `root` (with `reserve_bytes` as its staging hint, and
// waits until that memory is pinned), then saves `views` once plus `reps`
// more times, each waited for and removed.
SaveRun MeasureSaves(const std::string& root, ckpt::EngineOptions options,
                     const std::vector<ckpt::TensorView>& views, int reps, uint64_t reserve_bytes) {
  SaveRun run;
  options.staging_reserve_bytes = reserve_bytes;
  const Clock::time_point opened = Clock::now();
  auto engine = ckpt::Engine::Open(root, options);
  if (!engine.ok()) Die(absl::StrCat("Engine::Open: ", engine.status().ToString()));
  if (reserve_bytes > 0) {
    // (A training loop would be computing meanwhile: the reservation runs
    // on its own thread.)
    while (true) {
      const ckpt::EngineStats st = (*engine)->stats();
      if (st.staging_bytes >= reserve_bytes && st.staging_memory != "pageable") break;
      if (SecondsSince(opened) > 300) Die("the staging reservation did not finish in 300 s");
      usleep(1000);
    }
    run.reserve_s = SecondsSince(opened);
  }
  for (int r = 0; r <= reps; ++r) {
    const Clock::time_point start = Clock::now();
    auto handle = (*engine)->SaveAsync(r, views);
    if (!handle.ok()) Die(absl::StrCat("SaveAsync: ", handle.status().ToString()));
    const double returned = SecondsSince(start);
    if (options.lazy_staging) {
      absl::Status staged = (*handle)->WaitStaged();
      if (!staged.ok()) Die(absl::StrCat("WaitStaged: ", staged.ToString()));
    }
    const double held = SecondsSince(start);
    absl::Status done = (*handle)->Wait();
    if (!done.ok()) Die(absl::StrCat("Wait: ", done.ToString()));
    const ckpt::SaveStats stats = (*handle)->stats();
    Log(absl::StrCat(root, " save ", r, r == 0 ? " (first)" : "", ": returned ", returned, " s, blocked ",
                     held, " s, staging ", stats.staging_s, " s into ", stats.staging_memory,
                     ", persist ", stats.persist_gbps, " GB/s"));
    if (r == 0) {
      run.first_blocked_s = held;
      run.first_memory = stats.staging_memory;
    } else {
      run.returned.push_back(returned);
      run.blocked.push_back(held);
      run.staging.push_back(stats.staging_s);
      run.persist_gbps.push_back(stats.persist_gbps);
      run.seconds.push_back(stats.seconds);
      run.memory = stats.staging_memory;
    }
    std::error_code ec;
    std::filesystem::remove_all(stats.dir, ec);
  }
  run.backend = std::string((*engine)->backend());
  absl::Status closed = (*engine)->Close();
  if (!closed.ok()) Die(absl::StrCat("Close: ", closed.ToString()));
  std::error_code ec;
  std::filesystem::remove_all(root, ec);
  return run;
}

int Run() {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    const std::string why = err != cudaSuccess ? cudaGetErrorString(err) : "0 devices";
    std::cout << Skipped(why).dump() << std::endl;
    return 0;
  }
  const int device = absl::GetFlag(FLAGS_device);
  CheckCuda(cudaSetDevice(device), "cudaSetDevice");
  cudaDeviceProp prop{};
  CheckCuda(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  int driver = 0;
  (void)cudaDriverGetVersion(&driver);

  const uint64_t total = absl::GetFlag(FLAGS_bytes);
  const int n = std::max(1, absl::GetFlag(FLAGS_tensors));
  const int reps = std::max(1, absl::GetFlag(FLAGS_reps));
  const std::vector<size_t> sizes = TensorSizes(total, n);
  uint64_t bytes = 0;
  for (size_t s : sizes) bytes += s;

  cudaStream_t stream = nullptr;
  CheckCuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  std::vector<void*> dev(n, nullptr);
  std::vector<ckpt::TensorView> views(n);
  for (int i = 0; i < n; ++i) {
    CheckCuda(cudaMalloc(&dev[i], sizes[i]), "cudaMalloc");
    CheckCuda(cudaMemsetAsync(dev[i], i & 0xFF, sizes[i], stream), "cudaMemsetAsync");
    ckpt::TensorView& v = views[i];
    v.name = absl::StrCat("layers.", i / 10, ".param", i % 10);
    v.dtype = ckpt::DType::kUInt8;
    v.shape = {static_cast<int64_t>(sizes[i])};
    v.data = dev[i];
    v.nbytes = sizes[i];
    v.device = ckpt::TensorView::Device::kCuda;
    v.device_index = device;
    v.stream = stream;
  }
  CheckCuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  Log(absl::StrCat(n, " tensors, ", bytes, " bytes on ", prop.name));

  // The floor: every tensor copied once into page-locked memory.
  std::vector<double> d2h;
  {
    void* pinned = nullptr;
    CheckCuda(cudaMallocHost(&pinned, bytes), "cudaMallocHost");
    for (int r = 0; r <= reps; ++r) {  // r == 0 warms up
      const Clock::time_point start = Clock::now();
      char* dst = static_cast<char*>(pinned);
      for (int i = 0; i < n; ++i) {
        CheckCuda(cudaMemcpyAsync(dst, dev[i], sizes[i], cudaMemcpyDeviceToHost, stream),
                  "cudaMemcpyAsync");
        dst += sizes[i];
      }
      CheckCuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      if (r > 0) d2h.push_back(SecondsSince(start));
    }
    CheckCuda(cudaFreeHost(pinned), "cudaFreeHost");
  }
  Log(absl::StrCat("d2h memcpy: ", Median(d2h), " s"));

  std::string base = absl::GetFlag(FLAGS_dir);
  if (base.empty()) base = std::getenv("TMPDIR") != nullptr ? std::getenv("TMPDIR") : "/tmp";
  ckpt::EngineOptions options;
  options.io.chunk_bytes = absl::GetFlag(FLAGS_chunk_bytes);
  options.lazy_staging = absl::GetFlag(FLAGS_lazy);

  // 1. No size hint: the first save grows the pool unpinned (its caller does
  // not wait for pinning), and the pool is pinned behind it.
  const SaveRun unreserved = MeasureSaves(absl::StrCat(base, "/gpu_bench-unreserved-", ::getpid()),
                                          options, views, /*reps=*/1, /*reserve_bytes=*/0);
  // 2. The pool reserved off the loop at Open (`staging_reserve_bytes`):
  // the first save and the steady ones.
  const SaveRun reserved = MeasureSaves(absl::StrCat(base, "/gpu_bench-", ::getpid()), options,
                                        views, reps, /*reserve_bytes=*/bytes);
  // 3. Lazy staging, reserved: what `SaveAsync` itself holds the caller.
  ckpt::EngineOptions lazy_options = options;
  lazy_options.lazy_staging = true;
  const SaveRun lazy = MeasureSaves(absl::StrCat(base, "/gpu_bench-lazy-", ::getpid()), lazy_options,
                                    views, reps, /*reserve_bytes=*/bytes);
  for (void* p : dev) (void)cudaFree(p);
  (void)cudaStreamDestroy(stream);

  const double d2h_s = Median(d2h);
  const double blocked_s = Median(reserved.blocked);
  Json j;
  j["bench"] = "gpu_save";
  j["device"] = prop.name;
  j["driver_version"] = driver;
  j["bytes"] = bytes;
  j["tensors"] = n;
  j["reps"] = reps;
  j["mode"] = options.lazy_staging ? "lazy" : "eager";
  j["blocked_s"] = Round4(blocked_s);
  j["blocked_s_min"] = Round4(*std::min_element(reserved.blocked.begin(), reserved.blocked.end()));
  j["d2h_memcpy_s"] = Round4(d2h_s);
  j["blocked_over_d2h"] = d2h_s > 0 ? Round4(blocked_s / d2h_s) : 0;
  j["d2h_gbps"] = d2h_s > 0 ? Round4(bytes / d2h_s / 1e9) : 0;
  j["staging_gbps"] = blocked_s > 0 ? Round4(bytes / blocked_s / 1e9) : 0;
  j["staging_over_d2h_rate"] = blocked_s > 0 ? Round4(d2h_s / blocked_s) : 0;
  j["first_save_blocked_s"] = Round4(reserved.first_blocked_s);
  j["first_over_steady"] = blocked_s > 0 ? Round4(reserved.first_blocked_s / blocked_s) : 0;
  j["reserve_s"] = Round4(reserved.reserve_s);
  j["reserve_s_per_gb"] = Round4(reserved.reserve_s / (bytes / 1e9));
  j["unreserved_first_save_blocked_s"] = Round4(unreserved.first_blocked_s);
  j["unreserved_first_save_memory"] = unreserved.first_memory;
  j["lazy_blocked_s"] = Round4(Median(lazy.returned));
  j["lazy_staged_s"] = Round4(Median(lazy.blocked));
  j["staging_s"] = Round4(Median(reserved.staging));
  j["persist_gbps"] = Round4(Median(reserved.persist_gbps));
  j["save_s"] = Round4(Median(reserved.seconds));
  j["staging_memory"] = reserved.memory;
  j["backend"] = reserved.backend;
  j["chunk_bytes"] = options.io.chunk_bytes;
  std::cout << j.dump() << std::endl;
  return 0;
}

#else  // !CKPT_HAVE_CUDA

int Run() {
  std::cout << Skipped("built without CUDA").dump() << std::endl;
  return 0;
}

#endif  // CKPT_HAVE_CUDA

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return Run();
}
