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

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
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
#include "ckpt/engine.h"
#include "ckpt/file_system.h"
#include "ckpt/options.h"
#include "ckpt/reader.h"
#include "ckpt/tensor.h"
#include "nlohmann/json.hpp"
#include "xxhash.h"

ABSL_FLAG(std::string, dir, "", "Directory to write under (required); one root per backend.");
ABSL_FLAG(uint64_t, bytes, uint64_t{1} << 30, "Total bytes of the synthetic state.");
ABSL_FLAG(int, tensors, 150, "Number of tensors in the synthetic state (>= 16).");
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

using Clock = std::chrono::steady_clock;
using Json = nlohmann::ordered_json;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}
double Round3(double x) { return std::round(x * 1000) / 1000; }
uint64_t RoundUp(uint64_t x, uint64_t to) { return (x + to - 1) / to * to; }

void Log(const std::string& line) { std::cerr << "[io_bench] " << line << std::endl; }

[[noreturn]] void Die(const std::string& line) {
  Log("FATAL: " + line);
  std::exit(1);
}

// The median of the finite values of `v` (NaN marks a repetition that did not run).
double Median(std::vector<double> v) {
  std::erase_if(v, [](double x) { return !std::isfinite(x); });
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

Json NumOrNull(double x) { return std::isfinite(x) ? Json(Round3(x)) : Json(nullptr); }

// `Arena` is one 4 KiB-aligned, pre-faulted allocation (first touch is slow
// here, so it happens once, before anything is timed).
class Arena {
 public:
  explicit Arena(size_t size) : size_(RoundUp(std::max<size_t>(size, 1), 4096)) {
    data_ = static_cast<char*>(std::aligned_alloc(4096, size_));
    if (data_ == nullptr) Die(absl::StrCat("cannot allocate ", size_, " bytes"));
    std::memset(data_, 0, size_);
  }
  ~Arena() { std::free(data_); }
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  char* data() { return data_; }
  size_t size() const { return size_; }

 private:
  char* data_;
  size_t size_;
};

// One tensor of the synthetic state, at a 4 KiB-aligned `offset` of an arena.
struct Spec {
  std::string name;
  ckpt::DType dtype;
  std::vector<int64_t> shape;
  uint64_t nbytes = 0;
  uint64_t offset = 0;
};

// A transformer-like state: fp32 embedding, `layers` x (bf16 q/k/v/o and
// gate/up/down, fp32 norms and q/k/v biases), fp32 final norm, bf16 lm_head,
// small fp32 buffers, and one odd-sized uint8 blob that makes the total exact.
std::vector<Spec> MakeState(uint64_t bytes, int tensors) {
  if (tensors < 16) Die("--tensors must be >= 16");
  const int layers = (tensors - 4) / 12;
  const int fillers = tensors - 3 - 12 * layers;  // >= 1
  auto build = [&](int64_t h) {
    const int64_t vocab = 8 * h, ff = 4 * h;
    std::vector<Spec> s;
    auto add = [&](std::string name, ckpt::DType dt, std::vector<int64_t> shape) {
      uint64_t n = ckpt::DTypeSize(dt);
      for (int64_t d : shape) n *= d;
      s.push_back({std::move(name), dt, std::move(shape), n, 0});
    };
    using ckpt::DType;
    add("model.embed_tokens.weight", DType::kFloat32, {vocab, h});
    for (int i = 0; i < layers; ++i) {
      std::string p = absl::StrCat("model.layers.", i, ".");
      add(p + "input_layernorm.weight", DType::kFloat32, {h});
      for (const char* m : {"q", "k", "v", "o"}) {
        add(absl::StrCat(p, "self_attn.", m, "_proj.weight"), DType::kBFloat16, {h, h});
      }
      for (const char* m : {"q", "k", "v"}) {
        add(absl::StrCat(p, "self_attn.", m, "_proj.bias"), DType::kFloat32, {h});
      }
      add(p + "post_attention_layernorm.weight", DType::kFloat32, {h});
      add(p + "mlp.gate_proj.weight", DType::kBFloat16, {ff, h});
      add(p + "mlp.up_proj.weight", DType::kBFloat16, {ff, h});
      add(p + "mlp.down_proj.weight", DType::kBFloat16, {h, ff});
    }
    add("model.norm.weight", DType::kFloat32, {h});
    add("lm_head.weight", DType::kBFloat16, {vocab, h});
    for (int j = 1; j < fillers; ++j) {
      add(absl::StrCat("model.buffers.b", j), DType::kFloat32, {h / 2});
    }
    return s;
  };
  auto total = [](const std::vector<Spec>& s) {
    uint64_t t = 0;
    for (const Spec& x : s) t += x.nbytes;
    return t;
  };
  int64_t h = 16;
  if (total(build(h)) >= bytes) Die(absl::StrCat("--bytes ", bytes, " is too small"));
  while (total(build(h + 16)) < bytes) h += 16;
  std::vector<Spec> state = build(h);
  int64_t rest = static_cast<int64_t>(bytes - total(state));
  state.push_back({"extra_state.blob", ckpt::DType::kUInt8, {rest}, uint64_t(rest), 0});
  uint64_t offset = 0;
  for (Spec& s : state) {
    s.offset = offset;
    offset += RoundUp(s.nbytes, 4096);
  }
  Log(absl::StrFormat("state: %d tensors, %d layers, hidden %d, %d bytes", state.size(), layers,
                      h, bytes));
  return state;
}

uint64_t ArenaBytes(const std::vector<Spec>& state) {
  return state.back().offset + RoundUp(state.back().nbytes, 4096);
}

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
                      absl::GetFlag(FLAGS_queue_depth), direct ? 1 : 0, RoundUp(bytes, bs));
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

struct Bench {
  std::vector<Spec> state;
  std::vector<ckpt::TensorView> views;
  std::vector<ckpt::ReadTarget> targets;
  std::unique_ptr<Arena> src, dst;
  uint64_t bytes = 0;
};

void RemoveCheckpoint(const std::string& path) {
  if (absl::GetFlag(FLAGS_keep)) return;
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  ::sync();
}

// Times one `ReadInto` of every tensor into `b.dst` (filled with a pattern
// first, so stale bytes cannot pass), then checks the bytes against the source.
absl::StatusOr<double> ColdReadInto(Bench& b, ckpt::Reader& reader, const std::string& dir,
                                    Run& run) {
  std::memset(b.dst->data(), 0xA5, b.dst->size());
  run.resident_max = std::max(run.resident_max, ResidentBytes(dir));
  auto t0 = Clock::now();
  absl::Status read = reader.ReadInto(b.targets);
  double seconds = SecondsSince(t0);
  if (!read.ok()) return read;
  for (const Spec& s : b.state) {
    if (std::memcmp(b.src->data() + s.offset, b.dst->data() + s.offset, s.nbytes) != 0) {
      run.verified = false;
      return absl::DataLossError("restored bytes differ from the source in " + s.name);
    }
  }
  return seconds;
}

// One timed save and cold restore of `run`'s backend as checkpoint `step`.
void MeasureOnce(Bench& b, Run& run, int rep) {
  const int64_t step = rep + 1;
  ::sync();
  auto t0 = Clock::now();
  auto stats = run.engine->Save(step, b.views);
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

void Prepare(Bench& b) {
  b.bytes = absl::GetFlag(FLAGS_bytes);
  b.state = MakeState(b.bytes, absl::GetFlag(FLAGS_tensors));
  auto t0 = Clock::now();
  b.src = std::make_unique<Arena>(ArenaBytes(b.state));
  b.dst = std::make_unique<Arena>(ArenaBytes(b.state));
  uint64_t x = 0x9E3779B97F4A7C15ull;  // splitmix64: incompressible bytes
  auto* words = reinterpret_cast<uint64_t*>(b.src->data());
  for (size_t i = 0; i < b.src->size() / 8; ++i) {
    uint64_t z = (x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    words[i] = z ^ (z >> 31);
  }
  Log(absl::StrFormat("allocated, pre-faulted and filled 2 x %d bytes in %.2f s", b.src->size(),
                      SecondsSince(t0)));
  for (const Spec& s : b.state) {
    b.views.push_back({s.name, s.dtype, s.shape, b.src->data() + s.offset, s.nbytes});
    b.targets.push_back({s.name, b.dst->data() + s.offset, RoundUp(s.nbytes, 4096)});
  }
}

// Memory-side context for the disk figures: memcpy and XXH3 rates on the
// already-faulted arenas (what staging and verification cost per byte).
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
// already-faulted arenas (what staging and verification cost per byte).
Json EnvLine(Bench& b, const std::string& dir, const std::vector<FioResult>& fio) {
  double memcpy_s = INFINITY, xxh3_s = INFINITY;  // best of 3: the machine is shared
  for (int i = 0; i < 3; ++i) {
    auto t0 = Clock::now();
    std::memcpy(b.dst->data(), b.src->data(), b.src->size());
    memcpy_s = std::min(memcpy_s, SecondsSince(t0));
    t0 = Clock::now();
    volatile uint64_t h = XXH3_64bits(b.src->data(), b.src->size());
    (void)h;
    xxh3_s = std::min(xxh3_s, SecondsSince(t0));
  }
  const FioSeries f = Columns(fio);
  Json j;
  j["bench"] = "io_env";
  j["dir"] = dir;
  j["bytes"] = b.bytes;
  j["tensors"] = b.state.size();
  j["reps"] = fio.size();
  j["memcpy_gbps"] = NumOrNull(b.src->size() / memcpy_s / 1e9);
  j["xxh3_gbps"] = NumOrNull(b.src->size() / xxh3_s / 1e9);
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
  j["tensors"] = b.state.size();
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
    auto warm = run.engine->Save(0, b.views);  // warm-up, untimed
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
