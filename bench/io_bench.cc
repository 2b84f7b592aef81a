// io_bench: durable-write and cold-restore throughput of each I/O backend,
// next to fio's O_DIRECT io_uring figures measured in the same run.
//
// For each backend (io_uring or threads, O_DIRECT or buffered) it opens an
// engine on a fresh root under --dir, saves a synthetic transformer-like state
// once to warm up, then, per repetition:
//   fio write + read (same dir, block size, queue depth and bytes), then for
//   each backend: timed `Engine::Save` (fsync and commit included), cache
//   drop, `Reader::Open`, timed `Reader::ReadInto` into pre-faulted 4 KiB
//   aligned memory, and a byte-for-byte check against the source (untimed);
//   then a second cold `ReadInto` through the same reader, which shows what
//   the reader's one-time setup (buffers allocated on first use) cost.
// It prints one JSON line describing the machine ("io_env"), then one JSON
// line per backend ("io"). Medians over repetitions; ratios are medians of
// per-repetition ratios (each library run against the fio run just before it).
// Progress goes to stderr. See bench/README.md.
// (About 540 lines, over the house ~400: the fio baseline, every backend's
// runs and the JSON line are one benchmark, read top to bottom.)

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench_common.h"
#include "ckpt/engine.h"
#include "ckpt/file_system.h"
#include "ckpt/options.h"
#include "ckpt/reader.h"
#include "ckpt/tensor.h"
#include "nlohmann/json.hpp"
#include "xxhash.h"

ABSL_FLAG(std::string, dir, "", "Directory to write under (required); one root per backend.");
ABSL_FLAG(uint64_t, bytes, uint64_t{1} << 30, "Total bytes of the synthetic state.");
ABSL_FLAG(int, tensors, 150, "Number of tensors in the synthetic state (>= 4).");
ABSL_FLAG(int, reps, 1, "Repetitions (fio and every backend, interleaved); medians reported.");
ABSL_FLAG(std::string, backends, "uring_direct,uring_buffered,threads_direct,threads_buffered",
          "Comma-separated subset of the four backends to run.");
ABSL_FLAG(uint64_t, queue_depth, 32, "IoOptions.queue_depth, and fio's iodepth.");
ABSL_FLAG(uint64_t, chunk_bytes, uint64_t{1} << 20, "IoOptions.chunk_bytes, and fio's bs.");
ABSL_FLAG(std::string, fio, "fio", "fio binary; empty to skip fio.");
ABSL_FLAG(std::string, fio_extra, "", "Extra arguments appended to both fio command lines.");
ABSL_FLAG(double, fio_write_gbps, 0, "Use this fio write figure instead of running fio.");
ABSL_FLAG(double, fio_read_gbps, 0, "Use this fio read figure instead of running fio.");
ABSL_FLAG(bool, fio_buffered, true,
          "Also run a buffered fio write (end_fsync=1): context for the buffered backends.");
ABSL_FLAG(bool, keep, false, "Keep every checkpoint written (else each is removed after use).");

namespace {

using ckpt::bench::Clock;
using ckpt::bench::Die;
using ckpt::bench::SecondsSince;
using Json = nlohmann::ordered_json;

double Round3(double x) { return std::round(x * 1000) / 1000; }

void Log(const std::string& line) { ckpt::bench::Log("io_bench", line); }

// The median of the finite values of `v` (NaN marks a repetition that did not run).
double Median(std::vector<double> v) {
  std::erase_if(v, [](double x) { return !std::isfinite(x); });
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

Json NumOrNull(double x) { return std::isfinite(x) ? Json(Round3(x)) : Json(nullptr); }

// Bytes of the regular files in `dir` that sit in the page cache (mincore).
uint64_t ResidentBytes(const std::string& dir) {
  uint64_t resident = 0;
  const long page = sysconf(_SC_PAGESIZE);
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (!entry.is_regular_file()) continue;
    int fd = ::open(entry.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat st;
    if (::fstat(fd, &st) == 0 && st.st_size > 0) {
      void* map = ::mmap(nullptr, st.st_size, PROT_READ, MAP_SHARED, fd, 0);
      if (map != MAP_FAILED) {
        std::vector<unsigned char> vec((st.st_size + page - 1) / page);
        if (::mincore(map, st.st_size, vec.data()) == 0) {
          for (unsigned char v : vec) resident += (v & 1) ? page : 0;
        }
        ::munmap(map, st.st_size);
      }
    }
    ::close(fd);
  }
  return resident;
}

// Empties the page cache of the files in `dir`: `drop_caches` when this
// process may write it, else `File::DropCache` on a fresh open of each file.
// Returns the method used, marked "(incomplete)" when pages stayed resident.
std::string DropCache(const std::string& dir) {
  ::sync();
  int fd = ::open("/proc/sys/vm/drop_caches", O_WRONLY | O_CLOEXEC);
  if (fd >= 0) {
    bool ok = ::write(fd, "1", 1) == 1;
    ::close(fd);
    if (ok && ResidentBytes(dir) == 0) return "drop_caches";
  }
  auto fs = ckpt::PosixFileSystem();
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (!entry.is_regular_file()) continue;
    auto file = fs->Open(entry.path().string(), ckpt::OpenOptions{});
    if (!file.ok()) continue;
    (void)(*file)->DropCache();
    (void)(*file)->Close();
  }
  // tmpfs, for one, cannot drop what it holds.
  return ResidentBytes(dir) == 0 ? "fadvise_dontneed" : "fadvise_dontneed(incomplete)";
}

struct FioResult {
  double write_gbps = NAN;
  double read_gbps = NAN;
  double buffered_write_gbps = NAN;
};

std::optional<Json> RunFioJob(const std::string& args) {
  std::string cmd = absl::StrCat(absl::GetFlag(FLAGS_fio), " ", args, " --output-format=json");
  Log("$ " + cmd);
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) return std::nullopt;
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  if (::pclose(pipe) != 0) return std::nullopt;
  // fio may print notes before the JSON object.
  size_t brace = out.find('{');
  if (brace == std::string::npos) return std::nullopt;
  Json j = Json::parse(out.substr(brace), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return std::nullopt;
  return j;
}

// GB/s of one fio direction: bytes moved over fio's runtime for the job
// (which includes end_fsync).
double FioGbps(const Json& j, const char* dir) {
  const Json& d = j["jobs"][0][dir];
  double bytes = d.value("io_bytes", 0.0), ms = d.value("runtime", 0.0);
  return ms > 0 ? bytes / (ms / 1000) / 1e9 : NAN;
}

// The fio arguments both jobs share: the library's transfer size and depth.
std::string FioCommonArgs(uint64_t bytes, bool direct = true) {
  const uint64_t bs = absl::GetFlag(FLAGS_chunk_bytes);
  std::string args =
      absl::StrFormat("--bs=%d --iodepth=%d --direct=%d --ioengine=io_uring --size=%d", bs,
                      absl::GetFlag(FLAGS_queue_depth), direct ? 1 : 0, ckpt::AlignUp(bytes, bs));
  const std::string extra = absl::GetFlag(FLAGS_fio_extra);
  if (!extra.empty()) absl::StrAppend(&args, " ", extra);
  return args;
}

// fio, O_DIRECT, io_uring: a sequential durable write of the state's size,
// then a sequential read of the same file; then (--fio_buffered) a buffered
// durable write of a fresh file. The file is removed afterwards.
FioResult RunFio(const std::string& dir, uint64_t bytes) {
  FioResult r;
  if (absl::GetFlag(FLAGS_fio_write_gbps) > 0) r.write_gbps = absl::GetFlag(FLAGS_fio_write_gbps);
  if (absl::GetFlag(FLAGS_fio_read_gbps) > 0) r.read_gbps = absl::GetFlag(FLAGS_fio_read_gbps);
  if (absl::GetFlag(FLAGS_fio).empty() || (!std::isnan(r.write_gbps) && !std::isnan(r.read_gbps))) {
    return r;
  }
  const std::string common =
      absl::StrCat("--directory=", dir, " --filename=fio.dat ", FioCommonArgs(bytes));
  ::sync();
  if (auto j = RunFioJob("--name=ckpt_write --rw=write --end_fsync=1 " + common)) {
    if (std::isnan(r.write_gbps)) r.write_gbps = FioGbps(*j, "write");
    DropCache(dir);
    if (auto k = RunFioJob("--name=ckpt_read --rw=read " + common)) {
      if (std::isnan(r.read_gbps)) r.read_gbps = FioGbps(*k, "read");
    }
  } else {
    Log("fio failed; its figures are null");
  }
  const auto file = std::filesystem::path(dir) / "fio.dat";
  std::filesystem::remove(file);
  ::sync();
  if (absl::GetFlag(FLAGS_fio_buffered)) {
    const std::string buffered =
        absl::StrCat("--directory=", dir, " --filename=fio.dat ", FioCommonArgs(bytes, false));
    if (auto j = RunFioJob("--name=ckpt_write_buffered --rw=write --end_fsync=1 " + buffered)) {
      r.buffered_write_gbps = FioGbps(*j, "write");
    }
    std::filesystem::remove(file);
    ::sync();
  }
  return r;
}

struct BackendCase {
  std::string key;    // --backends spelling
  std::string label;  // JSON "backend"
  ckpt::IoBackend backend;
  ckpt::DirectIoMode direct;
};

const std::vector<BackendCase>& AllCases() {
  static const auto* cases = new std::vector<BackendCase>{
      {"uring_direct", "io_uring+O_DIRECT", ckpt::IoBackend::kUring, ckpt::DirectIoMode::kOn},
      {"uring_buffered", "io_uring+buffered", ckpt::IoBackend::kUring, ckpt::DirectIoMode::kOff},
      {"threads_direct", "threads+O_DIRECT", ckpt::IoBackend::kThreads, ckpt::DirectIoMode::kOn},
      {"threads_buffered", "threads+buffered", ckpt::IoBackend::kThreads,
       ckpt::DirectIoMode::kOff},
  };
  return *cases;
}

// One backend's engine and what its repetitions measured.
struct Run {
  BackendCase c;
  std::string root;
  ckpt::IoOptions io;
  std::unique_ptr<ckpt::Engine> engine;
  std::string skipped, error;
  // Per repetition (NaN where it did not run).
  std::vector<double> write_gbps, read_gbps, open_s;
  std::vector<double> read2_gbps;            // a second cold read, same reader
  std::vector<double> staging_s, persist_s;  // the engine's own phase figures
  std::string cold;
  uint64_t resident_max = 0;
  size_t shards = 0;
  uint64_t file_bytes = 0;
  bool verified = true;
};

// The source state, and a destination laid out like `src.memory`: each
// target sits at its view's offset, with the view's 4 KiB-rounded capacity.
struct Bench {
  ckpt::bench::State src;
  ckpt::AlignedBytes dst;
  std::vector<ckpt::ReadTarget> targets;
  uint64_t bytes = 0;
};

// The offset of `v` in `state.memory`.
uint64_t OffsetIn(const ckpt::bench::State& state, const ckpt::TensorView& v) {
  return static_cast<const char*>(v.data) - static_cast<const char*>(state.memory.data());
}

void RemoveCheckpoint(const std::string& path) {
  if (absl::GetFlag(FLAGS_keep)) return;
  ckpt::bench::RemoveAndSettle(path);
}

// Times one `ReadInto` of every tensor into `b.dst` (filled with a pattern
// first, so stale bytes cannot pass), then checks the bytes against the source.
absl::StatusOr<double> ColdReadInto(Bench& b, ckpt::Reader& reader, const std::string& dir,
                                    Run& run) {
  std::memset(b.dst.data(), 0xA5, b.dst.size());
  run.resident_max = std::max(run.resident_max, ResidentBytes(dir));
  auto t0 = Clock::now();
  absl::Status read = reader.ReadInto(b.targets);
  double seconds = SecondsSince(t0);
  if (!read.ok()) return read;
  const char* dst = static_cast<const char*>(b.dst.data());
  for (const ckpt::TensorView& v : b.src.views) {
    if (std::memcmp(v.data, dst + OffsetIn(b.src, v), v.nbytes) != 0) {
      run.verified = false;
      return absl::DataLossError("restored bytes differ from the source in " + v.name);
    }
  }
  return seconds;
}

// One timed save and cold restore of `run`'s backend as checkpoint `step`.
void MeasureOnce(Bench& b, Run& run, int rep) {
  const int64_t step = rep + 1;
  ::sync();
  auto t0 = Clock::now();
  auto stats = run.engine->Save(step, b.src.views);
  double write_s = SecondsSince(t0);
  if (!stats.ok()) {
    run.error = absl::StrCat("save: ", stats.status().ToString());
    return;
  }
  run.staging_s[rep] = stats->staging_s;
  run.persist_s[rep] = stats->persist_s;
  run.shards = stats->shard_count;
  run.file_bytes = stats->file_bytes;

  ckpt::ReaderOptions ropts;
  ropts.io = run.io;
  ropts.step = step;
  std::string method = DropCache(stats->dir);
  run.cold = run.c.direct == ckpt::DirectIoMode::kOn ? "o_direct+" + method : method;
  t0 = Clock::now();
  auto reader = ckpt::Reader::Open(run.root, ropts);
  double open_s = SecondsSince(t0);
  if (!reader.ok()) {
    run.error = absl::StrCat("reader open: ", reader.status().ToString());
    return;
  }
  // Two cold reads through the same reader: the first is a whole restore,
  // the second shows what the reader's one-time setup cost the first.
  double read_s[2];
  for (int pass = 0; pass < 2; ++pass) {
    if (pass > 0) DropCache(stats->dir);
    auto r = ColdReadInto(b, **reader, stats->dir, run);
    if (!r.ok()) {
      run.error = absl::StrCat(pass == 0 ? "read: " : "second read: ", r.status().ToString());
      return;
    }
    read_s[pass] = *r;
  }
  reader->reset();
  RemoveCheckpoint(stats->dir);

  double w = b.bytes / write_s / 1e9, r = b.bytes / read_s[0] / 1e9, r2 = b.bytes / read_s[1] / 1e9;
  run.write_gbps[rep] = w;
  run.read_gbps[rep] = r;
  run.read2_gbps[rep] = r2;
  run.open_s[rep] = open_s;
  Log(absl::StrFormat(
      "%s step %d: save %.3f s (%.3f GB/s; staging %.3f s, persist %.3f s), reader open %.3f s, "
      "read %.3f s (%.3f GB/s), again %.3f s (%.3f GB/s)",
      run.c.label, step, write_s, w, stats->staging_s, stats->persist_s, open_s, read_s[0], r,
      read_s[1], r2));
}

// Builds the source state (bench_common's transformer-like state of exactly
// --bytes in --tensors tensors) and a pre-faulted destination of the same layout.
void Prepare(Bench& b) {
  b.bytes = absl::GetFlag(FLAGS_bytes);
  b.src = ckpt::bench::MakeTransformerState(b.bytes, absl::GetFlag(FLAGS_tensors));
  auto t0 = Clock::now();
  auto dst = ckpt::AlignedBytes::Allocate(b.src.memory.size(), /*prefault=*/true);
  if (!dst.ok()) Die(std::string(dst.status().ToString()));
  b.dst = std::move(*dst);
  Log(absl::StrFormat("allocated and pre-faulted the %d-byte destination in %.2f s", b.dst.size(),
                      SecondsSince(t0)));
  char* base = static_cast<char*>(b.dst.data());
  for (const ckpt::TensorView& v : b.src.views) {
    b.targets.push_back({v.name, base + OffsetIn(b.src, v), ckpt::AlignUp(v.nbytes)});
  }
}

// A per-repetition series as a JSON array (null where a repetition did not run).
Json Series(const std::vector<double>& v) {
  Json a = Json::array();
  for (double x : v) a.push_back(NumOrNull(x));
  return a;
}

// `num[i] / den[i]` for each repetition.
std::vector<double> Ratios(const std::vector<double>& num, const std::vector<double>& den) {
  std::vector<double> r(num.size(), NAN);
  for (size_t i = 0; i < num.size() && i < den.size(); ++i) r[i] = num[i] / den[i];
  return r;
}

struct FioSeries {
  std::vector<double> write, read, buffered_write;
};

FioSeries Columns(const std::vector<FioResult>& fio) {
  FioSeries s;
  for (const FioResult& f : fio) {
    s.write.push_back(f.write_gbps);
    s.read.push_back(f.read_gbps);
    s.buffered_write.push_back(f.buffered_write_gbps);
  }
  return s;
}

// Memory-side context for the disk figures: memcpy and XXH3 rates on the
// already-faulted source and destination (what staging and verification
// cost per byte).
Json EnvLine(Bench& b, const std::string& dir, const std::vector<FioResult>& fio) {
  double memcpy_s = INFINITY, xxh3_s = INFINITY;  // best of 3: the machine is shared
  for (int i = 0; i < 3; ++i) {
    auto t0 = Clock::now();
    std::memcpy(b.dst.data(), b.src.memory.data(), b.src.memory.size());
    memcpy_s = std::min(memcpy_s, SecondsSince(t0));
    t0 = Clock::now();
    volatile uint64_t h = XXH3_64bits(b.src.memory.data(), b.src.memory.size());
    (void)h;
    xxh3_s = std::min(xxh3_s, SecondsSince(t0));
  }
  const FioSeries f = Columns(fio);
  Json j;
  j["bench"] = "io_env";
  j["dir"] = dir;
  j["bytes"] = b.bytes;
  j["tensors"] = b.src.views.size();
  j["reps"] = fio.size();
  j["memcpy_gbps"] = NumOrNull(b.src.memory.size() / memcpy_s / 1e9);
  j["xxh3_gbps"] = NumOrNull(b.src.memory.size() / xxh3_s / 1e9);
  j["fio_write_gbps_reps"] = Series(f.write);
  j["fio_read_gbps_reps"] = Series(f.read);
  j["fio_buffered_write_gbps_reps"] = Series(f.buffered_write);
  j["fio_args"] = FioCommonArgs(b.bytes) + " (write: --rw=write --end_fsync=1; read: --rw=read)";
  return j;
}

Json ResultLine(const Bench& b, const Run& run, const std::vector<FioResult>& fio) {
  const FioSeries f = Columns(fio);
  Json j;
  j["bench"] = "io";
  j["backend"] = run.c.label;
  j["bytes"] = b.bytes;
  if (!run.skipped.empty()) {
    j["skipped"] = run.skipped;
    return j;
  }
  if (!run.error.empty()) j["error"] = run.error;
  j["write_gbps"] = NumOrNull(Median(run.write_gbps));
  j["read_gbps"] = NumOrNull(Median(run.read_gbps));
  j["fio_write_gbps"] = NumOrNull(Median(f.write));
  j["fio_read_gbps"] = NumOrNull(Median(f.read));
  j["write_over_fio"] = NumOrNull(Median(Ratios(run.write_gbps, f.write)));
  j["read_over_fio"] = NumOrNull(Median(Ratios(run.read_gbps, f.read)));
  j["read_again_gbps"] = NumOrNull(Median(run.read2_gbps));
  j["read_again_over_fio"] = NumOrNull(Median(Ratios(run.read2_gbps, f.read)));
  if (run.c.direct == ckpt::DirectIoMode::kOff) {
    j["fio_buffered_write_gbps"] = NumOrNull(Median(f.buffered_write));
    j["write_over_fio_buffered"] = NumOrNull(Median(Ratios(run.write_gbps, f.buffered_write)));
  }
  j["engine_backend"] = run.engine ? std::string(run.engine->backend()) : "";
  j["tensors"] = b.src.views.size();
  j["shards"] = run.shards;
  j["file_bytes"] = run.file_bytes;
  j["reps"] = run.write_gbps.size();
  j["write_gbps_reps"] = Series(run.write_gbps);
  j["read_gbps_reps"] = Series(run.read_gbps);
  j["save_staging_s"] = NumOrNull(Median(run.staging_s));
  j["save_persist_s"] = NumOrNull(Median(run.persist_s));
  j["reader_open_s"] = NumOrNull(Median(run.open_s));
  j["cold"] = run.cold;
  j["resident_bytes_at_read"] = run.resident_max;
  j["verified"] = run.verified && run.error.empty() && std::isfinite(Median(run.read_gbps));
  return j;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string dir = absl::GetFlag(FLAGS_dir);
  if (dir.empty()) Die("--dir is required");
  std::filesystem::create_directories(dir);

  Bench b;
  Prepare(b);

  std::vector<Run> runs;
  for (const std::string& key :
       std::vector<std::string>(absl::StrSplit(absl::GetFlag(FLAGS_backends), ','))) {
    auto it = std::find_if(AllCases().begin(), AllCases().end(),
                           [&](const BackendCase& c) { return c.key == key; });
    if (it == AllCases().end()) Die(absl::StrCat("unknown backend ", key));
    Run& run = runs.emplace_back();
    run.c = *it;
    run.root = (std::filesystem::path(dir) / ("io-" + run.c.key)).string();
    std::filesystem::remove_all(run.root);  // a fresh root
    run.io.backend = run.c.backend;
    run.io.direct = run.c.direct;
    run.io.queue_depth = absl::GetFlag(FLAGS_queue_depth);
    run.io.chunk_bytes = absl::GetFlag(FLAGS_chunk_bytes);
    ckpt::EngineOptions options;
    options.io = run.io;
    auto engine = ckpt::Engine::Open(run.root, options);
    if (!engine.ok()) {
      run.skipped = engine.status().ToString();
      Log(run.c.label + " skipped: " + run.skipped);
      continue;
    }
    run.engine = std::move(*engine);
    auto t0 = Clock::now();
    auto warm = run.engine->Save(0, b.src.views);  // warm-up, untimed
    if (!warm.ok()) {
      run.error = absl::StrCat("warm-up save: ", warm.status().ToString());
      Log(run.c.label + " " + run.error);
      continue;
    }
    Log(absl::StrFormat("%s (%s) warm-up save %.3f s", run.c.label, run.engine->backend(),
                        SecondsSince(t0)));
    RemoveCheckpoint(warm->dir);
  }

  // Each repetition runs fio and every backend once, in an order rotated by
  // one per repetition, so that no run always follows the same neighbour.
  const int reps = std::max(1, absl::GetFlag(FLAGS_reps));
  std::vector<FioResult> fio(reps);
  for (Run& run : runs) {
    for (auto* v : {&run.write_gbps, &run.read_gbps, &run.open_s, &run.read2_gbps,
                    &run.staging_s, &run.persist_s}) {
      v->assign(reps, NAN);
    }
  }
  const size_t slots = runs.size() + 1;  // slot 0 is fio
  for (int rep = 0; rep < reps; ++rep) {
    Log(absl::StrFormat("rep %d of %d", rep + 1, reps));
    for (size_t k = 0; k < slots; ++k) {
      const size_t slot = (k + rep) % slots;
      if (slot == 0) {
        fio[rep] = RunFio(dir, b.bytes);
        Log(absl::StrFormat("fio: write %.3f GB/s, read %.3f GB/s, buffered write %.3f GB/s",
                            fio[rep].write_gbps, fio[rep].read_gbps,
                            fio[rep].buffered_write_gbps));
        continue;
      }
      Run& run = runs[slot - 1];
      if (run.engine && run.error.empty()) MeasureOnce(b, run, rep);
    }
  }

  std::cout << EnvLine(b, dir, fio).dump() << std::endl;
  bool ok = true;
  for (const Run& run : runs) {
    std::cout << ResultLine(b, run, fio).dump() << std::endl;
    ok = ok && run.error.empty();
  }
  if (absl::GetFlag(FLAGS_keep)) Log("checkpoints kept under " + dir);
  return ok ? 0 : 1;
}
