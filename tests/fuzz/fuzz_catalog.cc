// Fuzzes the catalog and the reader over a real directory: each input
// describes a small checkpoint root (step, temp and trash directories,
// LATEST, manifests given a correct checksum trailer, shard files,
// symlinks into and out of the root, FIFOs, empty directories, garbage
// names; see catalog_input.h), which is written under a fresh directory in
// /dev/shm (or $TMPDIR), read through the public API (ListSteps,
// ListCheckpoints, SummarizeCheckpoint, ReadLatestHint, Reader::Open with
// ReadAll, Read and Verify; threads backend, small buffers), then removed.
// Properties checked (abort() on violation), besides no crash, hang, leak
// or sanitizer report:
// - ListSteps is exactly the sorted steps of the root's entries whose names
//   parse as checkpoint directories; ListCheckpoints lists the same steps
//   and agrees with SummarizeCheckpoint; a step not listed never has a
//   good summary.
// - Nothing is ever read through a symlink or from outside the root: a
//   good summary, an opened reader (and each base of its delta chain) and a
//   LATEST hint all sit on real directories and regular files.
// - ReadLatestHint returns a step only for a LATEST whose trimmed text is
//   that step's directory name.
// - Reader::Open returns a listed step (the one asked for, if any); asked
//   for the newest, it skips no newer full checkpoint whose manifest is
//   good, and fails with kDataLoss/kNotFound only when there is none.
// - ReadAll succeeds exactly when Verify does; what it returns matches the
//   manifest (names, sizes, XXH3), and so does Read.
// - The read-only calls change nothing: the tree (names, types, sizes,
//   contents, link targets) is the same afterwards.
// (About 590 lines, over the house ~400: the input decoder and the
// properties checked over it are one fuzz target.)
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "catalog_input.h"
#include "ckpt/catalog.h"
#include "ckpt/reader.h"
#include "format/names.h"
#include "util/hash.h"

namespace {

using namespace ckpt::fuzz;
namespace fs = std::filesystem;

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "fuzz_catalog: property violated: %s\n", what.c_str());
  std::abort();
}
#define CHECK_OR_FAIL(cond, ...)                               \
  do {                                                         \
    if (!(cond)) Fail(absl::StrCat(#cond, ": ", __VA_ARGS__)); \
  } while (false)

// Forward reader over the input; past the end it yields zeros and `done()`.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool done() const { return pos_ >= size_; }
  bool overrun() const { return overrun_; }
  uint8_t U8() {
    if (pos_ >= size_) {
      overrun_ = true;
      return 0;
    }
    return data_[pos_++];
  }
  uint16_t U16() {
    const uint16_t lo = U8();
    return static_cast<uint16_t>(lo | (U8() << 8));
  }
  int64_t I64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= uint64_t{U8()} << (8 * i);
    return static_cast<int64_t>(v);
  }
  absl::string_view Bytes(size_t n) {
    if (n > size_ - pos_) {
      overrun_ = true;
      n = size_ - pos_;
    }
    absl::string_view s(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return s;
  }
  absl::string_view Bytes8() { return Bytes(U8()); }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  bool overrun_ = false;
};

std::string SafeName(absl::string_view raw) {
  std::string name(raw);
  for (char& c : name) {
    if (c == '/' || c == '\0') c = '_';
  }
  if (name.empty() || name == "." || name == "..") name = "_";
  return name;
}

// $CKPT_FUZZ_VERBOSE set: what each call returned, on stderr.
bool Verbose() {
  static const bool verbose = std::getenv("CKPT_FUZZ_VERBOSE") != nullptr;
  return verbose;
}
void Note(const std::string& line) {
  if (Verbose()) std::fprintf(stderr, "fuzz_catalog: %s\n", line.c_str());
}

std::string Hex(uint64_t v) { return ckpt::internal::HashToHex(v); }

// The fuzzed tree: BASE/root (what the API is pointed at), BASE/outside
// (directories that root entries link to) and BASE/linked (files that
// root entries link to).
class Tree {
 public:
  // False if the temp directory cannot be made (the input is then skipped).
  bool Create() {
    std::string parent = "/dev/shm";
    if (access(parent.c_str(), W_OK) != 0) {
      const char* tmp = std::getenv("TMPDIR");
      parent = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
    }
    std::string templ = parent + "/ckpt-fuzz-catalog-XXXXXX";
    if (mkdtemp(templ.data()) == nullptr) return false;
    base_ = templ;
    root_ = base_ + "/root";
    outside_ = base_ + "/outside";
    linked_ = base_ + "/linked";
    for (const std::string& d : {root_, outside_, linked_}) {
      if (mkdir(d.c_str(), 0755) != 0) return false;
    }
    root_fd_ = open(root_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    outside_fd_ = open(outside_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    return root_fd_ >= 0 && outside_fd_ >= 0;
  }

  // Removes the tree, unless $CKPT_FUZZ_KEEP_TREE is set (to look at what
  // an input makes: the path is printed).
  ~Tree() {
    if (root_fd_ >= 0) close(root_fd_);
    if (outside_fd_ >= 0) close(outside_fd_);
    if (base_.empty()) return;
    if (std::getenv("CKPT_FUZZ_KEEP_TREE") != nullptr) {
      std::fprintf(stderr, "fuzz_catalog: kept %s\n", base_.c_str());
      return;
    }
    // remove_all removes symlinks as links, never following them.
    std::error_code ec;
    fs::remove_all(base_, ec);
  }

  const std::string& base() const { return base_; }
  const std::string& root() const { return root_; }
  // Steps named by the input's step directories (listed or not).
  const std::set<int64_t>& named_steps() const { return named_steps_; }

  void Materialize(Input& in) {
    for (size_t n = 0; n < kMaxEntries && !in.done(); ++n) {
      if (!Entry(in) || in.overrun()) return;
    }
  }

 private:
  std::string DirName(Input& in) {
    const uint8_t sel = in.U8() % 8;
    switch (sel) {
      case kRoot: return "";
      case kStep: {
        const int64_t step = in.U8();
        named_steps_.insert(step);
        return ckpt::StepDirName(step);
      }
      case kStep64: {
        const int64_t step = in.I64();
        named_steps_.insert(step);
        return SafeName(ckpt::StepDirName(step));
      }
      case kTemp: {
        const int64_t step = in.U8();
        return ckpt::internal::TempDirName(step, in.U8());
      }
      case kTrash: return absl::StrCat(".trash-", ckpt::StepDirName(in.U8()), "-0000000000000001");
      case kStepRaw: return SafeName(absl::StrCat("step-", in.Bytes(20)));
      case kRawName: return SafeName(in.Bytes8());
      default: {  // kStepSuffix
        const int64_t step = in.U8();
        named_steps_.insert(step);
        return SafeName(absl::StrCat(ckpt::StepDirName(step), std::string(1, static_cast<char>(in.U8()))));
      }
    }
  }

  std::string FileName(Input& in) {
    switch (in.U8() % 4) {
      case kManifestName: return "MANIFEST.json";
      case kLatestName: return "LATEST";
      case kRawFileName: return SafeName(in.Bytes8());
      default: return "MANIFEST.json.tmp";
    }
  }

  // The file contents of Segments, bounded by what the tree may still hold.
  std::string Contents(Input& in) {
    std::string out;
    const uint8_t count = in.U8();
    for (uint8_t i = 0; i < count && !in.overrun(); ++i) {
      const uint16_t zeros = in.U16();
      const uint16_t length = in.U16();
      const absl::string_view data = in.Bytes(length);
      if (bytes_ + out.size() + zeros + data.size() > kMaxTreeBytes) break;
      out.append(zeros, '\0');
      out.append(data.data(), data.size());
    }
    return out;
  }

  // A manifest: the body with "$PREV" replaced, then the checksum trailer.
  std::string ManifestContents(Input& in) {
    std::string body = absl::StrReplaceAll(in.Bytes(in.U16()), {{kPrevToken, prev_manifest_hash_}});
    const uint64_t hash = ckpt::internal::Xxh3(body.data(), body.size());
    prev_manifest_hash_ = Hex(hash);
    absl::StrAppend(&body, ",\n \"manifest_xxh3\": \"", Hex(hash), "\"\n}\n");
    return body;
  }

  // An owned descriptor of directory `name` of the root (made if missing;
  // for a linked one, its target outside), or -1 when something else has
  // that name. Never follows a link the input planted.
  int OpenDir(const std::string& name) {
    if (name.empty()) return dup(root_fd_);
    if (linked_dirs_.count(name) > 0) {
      return openat(outside_fd_, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    }
    if (mkdirat(root_fd_, name.c_str(), 0755) != 0 && errno != EEXIST) return -1;
    return openat(root_fd_, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  }

  // Writes a new regular file; false if the name is taken.
  bool WriteFile(int dir_fd, const std::string& name, const std::string& contents) {
    const int fd = openat(dir_fd, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) return false;
    size_t done = 0;
    while (done < contents.size()) {
      const ssize_t n = pwrite(fd, contents.data() + done, contents.size() - done, done);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    close(fd);
    bytes_ += contents.size();
    return true;
  }

  // A regular file under BASE/linked and a symlink `name` in `dir_fd` to it.
  void WriteLinkedFile(int dir_fd, const std::string& name, const std::string& contents) {
    const std::string target_name = absl::StrCat("f", linked_files_++);
    const int linked_fd = open(linked_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (linked_fd < 0) return;
    if (WriteFile(linked_fd, target_name, contents)) {
      (void)symlinkat(absl::StrCat(linked_, "/", target_name).c_str(), dir_fd, name.c_str());
    }
    close(linked_fd);
  }

  // One entry; false once the input is exhausted.
  bool Entry(Input& in) {
    const uint8_t kind = in.U8() % 8;
    const std::string dir = DirName(in);
    if (kind == kDirLinked) {
      if (dir.empty() || linked_dirs_.count(dir) > 0 ||
          faccessat(root_fd_, dir.c_str(), F_OK, AT_SYMLINK_NOFOLLOW) == 0) {
        return true;
      }
      if (mkdirat(outside_fd_, dir.c_str(), 0755) != 0) return true;
      if (symlinkat(absl::StrCat(outside_, "/", dir).c_str(), root_fd_, dir.c_str()) == 0) {
        linked_dirs_.insert(dir);
      }
      return true;
    }
    // Decode the rest of the entry before touching the disk.
    std::string name, contents, target;
    switch (kind) {
      case kFile:
      case kFileLinked:
        name = FileName(in);
        contents = Contents(in);
        break;
      case kManifest:
      case kManifestLinked:
        name = std::string(ckpt::internal::kManifestName);
        contents = ManifestContents(in);
        break;
      case kOddSymlink:
        name = FileName(in);
        target = std::string(in.Bytes8());
        std::replace(target.begin(), target.end(), '\0', '_');
        if (target.empty()) target = "_";
        break;
      case kFifo: name = FileName(in); break;
      default: break;  // kEmptyDir
    }
    if (in.overrun()) return false;
    const int dir_fd = OpenDir(dir);
    if (dir_fd < 0) return true;
    switch (kind) {
      case kFile:
      case kManifest: (void)WriteFile(dir_fd, name, contents); break;
      case kFileLinked:
      case kManifestLinked: WriteLinkedFile(dir_fd, name, contents); break;
      case kOddSymlink: (void)symlinkat(target.c_str(), dir_fd, name.c_str()); break;
      case kFifo: (void)mkfifoat(dir_fd, name.c_str(), 0644); break;
      default: break;
    }
    close(dir_fd);
    return true;
  }

  std::string base_, root_, outside_, linked_;
  int root_fd_ = -1, outside_fd_ = -1;
  std::set<std::string> linked_dirs_;
  std::set<int64_t> named_steps_;
  std::string prev_manifest_hash_ = "0000000000000000";
  uint64_t bytes_ = 0;
  int linked_files_ = 0;
};

// Everything under `dir`, never following a link: path -> type, size,
// contents hash or link target.
std::map<std::string, std::string> Snapshot(const std::string& dir) {
  std::map<std::string, std::string> out;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path& p = it->path();
    struct stat st;
    if (lstat(p.c_str(), &st) != 0) {
      out[p] = "vanished";
      continue;
    }
    std::string what = absl::StrCat(st.st_mode & S_IFMT, " ", st.st_mode & 07777, " ", st.st_size);
    if (S_ISREG(st.st_mode)) {
      std::ifstream file(p, std::ios::binary);
      std::stringstream bytes;
      bytes << file.rdbuf();
      const std::string s = bytes.str();
      absl::StrAppend(&what, " ", Hex(ckpt::internal::Xxh3(s.data(), s.size())));
    } else if (S_ISLNK(st.st_mode)) {
      std::error_code link_ec;
      absl::StrAppend(&what, " -> ", fs::read_symlink(p, link_ec).string());
    }
    out[p] = what;
  }
  if (ec) out["<error>"] = ec.message();
  return out;
}

bool IsRealDir(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}
bool IsRegularFile(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string StepDir(const std::string& root, int64_t step) {
  return absl::StrCat(root, "/", ckpt::StepDirName(step));
}

// What ListSteps must return: the root's names that parse, sorted.
std::vector<int64_t> ExpectedSteps(const std::string& root) {
  std::vector<int64_t> steps;
  std::error_code ec;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    if (auto step = ckpt::internal::ParseCheckpointDirName(it->path().filename().string())) {
      steps.push_back(*step);
    }
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

void CheckGoodSummary(const std::string& root, const ckpt::CheckpointSummary& s) {
  CHECK_OR_FAIL(IsRealDir(s.dir), "step ", s.step, " summarised through a link or non-directory ", s.dir);
  CHECK_OR_FAIL(s.dir == StepDir(root, s.step), s.dir);
  CHECK_OR_FAIL(IsRegularFile(absl::StrCat(s.dir, "/MANIFEST.json")), "step ", s.step,
                ": manifest read through a link");
  const bool delta = s.kind == ckpt::CheckpointKind::kDelta;
  CHECK_OR_FAIL(delta == (s.delta_mode != ckpt::DeltaOptions::Mode::kNone), "step ", s.step, ": a ",
                ckpt::CheckpointKindName(s.kind), " with delta mode ", ckpt::DeltaModeName(s.delta_mode));
  if (delta) CHECK_OR_FAIL(s.base_step >= 0 && s.base_step < s.step, s.base_step);
}

bool SameSummary(const ckpt::CheckpointSummary& a, const ckpt::CheckpointSummary& b) {
  return a.step == b.step && a.dir == b.dir && a.manifest_status.code() == b.manifest_status.code() &&
         a.kind == b.kind && a.base_step == b.base_step && a.delta_mode == b.delta_mode &&
         a.tensor_bytes == b.tensor_bytes && a.file_bytes == b.file_bytes &&
         a.tensor_count == b.tensor_count && a.shard_count == b.shard_count &&
         a.manifest_xxh3 == b.manifest_xxh3 && a.compacted == b.compacted;
}

void CheckLatest(const std::string& root) {
  auto hint = ckpt::ReadLatestHint(root);
  Note(absl::StrCat("LATEST: ", !hint.ok()          ? hint.status().ToString()
                                : hint->has_value() ? absl::StrCat(**hint)
                                                    : "none"));
  if (!hint.ok() || !hint->has_value()) return;
  const std::string latest = root + "/LATEST";
  CHECK_OR_FAIL(IsRegularFile(latest), "a LATEST hint read through a link or non-file");
  std::ifstream file(latest, std::ios::binary);
  std::stringstream text;
  text << file.rdbuf();
  CHECK_OR_FAIL(absl::StripAsciiWhitespace(text.str()) == ckpt::StepDirName(**hint), "LATEST says \"",
                absl::CHexEscape(text.str()), "\", hint is step ", **hint);
}

void CheckReader(const std::string& root, uint8_t flags, std::optional<int64_t> explicit_step,
                 const std::vector<int64_t>& steps,
                 const std::map<int64_t, ckpt::CheckpointSummary>& summaries) {
  ckpt::ReaderOptions options;
  options.io.backend = ckpt::IoBackend::kThreads;
  options.io.direct = (flags & 1) != 0 ? ckpt::DirectIoMode::kAuto : ckpt::DirectIoMode::kOff;
  static constexpr int kChunkShift[] = {0, 1, 2, 4};
  options.io.chunk_bytes = size_t{4096} << kChunkShift[(flags >> 1) & 3];
  options.io.queue_depth = size_t{1} << ((flags >> 3) & 3);
  options.io.buffer_bytes = (flags & 0x80) != 0 ? options.io.chunk_bytes : size_t{256} << 10;
  switch ((flags >> 5) & 3) {
    case kStepNewest: break;
    case kStepLastListed:
      if (!steps.empty()) options.step = steps.back();
      break;
    case kStepFirstListed:
      if (!steps.empty()) options.step = steps.front();
      break;
    default: options.step = explicit_step; break;
  }
  auto good_full = [&](int64_t step) {
    auto it = summaries.find(step);
    return it != summaries.end() && it->second.manifest_status.ok() && it->second.kind == ckpt::CheckpointKind::kFull;
  };

  auto reader = ckpt::Reader::Open(root, options);
  Note(absl::StrCat(
      "Reader::Open(step ", options.step.has_value() ? absl::StrCat(*options.step) : "newest",
      "): ", reader.ok() ? absl::StrCat("step ", (*reader)->step()) : reader.status().ToString()));
  if (!reader.ok()) {
    if (!options.step.has_value() &&
        (absl::IsDataLoss(reader.status()) || absl::IsNotFound(reader.status()))) {
      for (int64_t s : steps) {
        CHECK_OR_FAIL(!good_full(s), "Open(newest) failed (", reader.status().ToString(),
                      ") with a good full checkpoint at step ", s);
      }
    }
    return;
  }
  ckpt::Reader& r = **reader;
  const int64_t step = r.step();
  CHECK_OR_FAIL(std::binary_search(steps.begin(), steps.end(), step), "opened unlisted step ", step);
  if (options.step.has_value()) CHECK_OR_FAIL(step == *options.step, step, " for ", *options.step);
  CHECK_OR_FAIL(r.dir() == StepDir(root, step), r.dir());
  // The opened step and every base of its chain: good manifests on real
  // directories.
  for (int64_t link = step, n = 0;; ++n) {
    auto it = summaries.find(link);
    CHECK_OR_FAIL(it != summaries.end() && it->second.manifest_status.ok(), "opened step ", step,
                  " via step ", link, " whose manifest is not good");
    CheckGoodSummary(root, it->second);
    if (link == step) CHECK_OR_FAIL(it->second.tensor_count == r.tensors().size(), step);
    if (it->second.kind != ckpt::CheckpointKind::kDelta) break;
    CHECK_OR_FAIL(n < 300, "delta chain too long");
    link = it->second.base_step;
  }
  if (!options.step.has_value()) {
    for (int64_t s : steps) {
      CHECK_OR_FAIL(s <= step || !good_full(s), "Open(newest) opened step ", step,
                    " past a good full checkpoint at step ", s);
    }
  }
  for (const ckpt::TensorInfo& t : r.tensors()) {
    const ckpt::TensorInfo* found = r.Find(t.name);
    CHECK_OR_FAIL(found != nullptr && found->name == t.name, "Find(\"", absl::CHexEscape(t.name), "\")");
  }

  auto all = r.ReadAll();
  const absl::Status verified = r.Verify();
  Note(absl::StrCat("ReadAll: ", all.status().ToString(), "; Verify: ", verified.ToString()));
  CHECK_OR_FAIL(all.ok() == verified.ok(), "ReadAll: ", all.status().ToString(),
                "; Verify: ", verified.ToString());
  if (!all.ok()) return;
  CHECK_OR_FAIL(all->size() == r.tensors().size(), all->size());
  for (size_t i = 0; i < all->size(); ++i) {
    const ckpt::Tensor& t = (*all)[i];
    const ckpt::TensorInfo& info = r.tensors()[i];
    CHECK_OR_FAIL(t.name == info.name && t.bytes.size() == info.raw_bytes, info.name);
    CHECK_OR_FAIL(ckpt::internal::Xxh3(t.bytes.data(), t.bytes.size()) == info.xxh3, info.name);
  }
  if (!all->empty()) {
    auto one = r.Read(r.tensors().front().name);
    CHECK_OR_FAIL(one.ok(), one.status().ToString());
    CHECK_OR_FAIL(one->bytes.size() == all->front().bytes.size() &&
                      std::memcmp(one->bytes.data(), all->front().bytes.data(), one->bytes.size()) == 0,
                  "Read differs from ReadAll");
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("CKPT_LOG", "off", /*overwrite=*/0);  // "skipping step ..." for most inputs
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  const uint8_t flags = in.U8();
  std::optional<int64_t> explicit_step;
  if (((flags >> 5) & 3) == kStepExplicit) explicit_step = in.I64();
  Tree tree;
  if (!tree.Create()) return 0;
  tree.Materialize(in);
  const std::string& root = tree.root();
  const auto before = Snapshot(tree.base());

  const std::vector<int64_t> expected = ExpectedSteps(root);
  auto steps = ckpt::ListSteps(root);
  CHECK_OR_FAIL(steps.ok(), steps.status().ToString());
  CHECK_OR_FAIL(*steps == expected, steps->size(), " steps listed, ", expected.size(), " expected");

  auto listed = ckpt::ListCheckpoints(root);
  CHECK_OR_FAIL(listed.ok(), listed.status().ToString());
  CHECK_OR_FAIL(listed->size() == expected.size(), listed->size());
  std::map<int64_t, ckpt::CheckpointSummary> summaries;
  for (size_t i = 0; i < listed->size(); ++i) {
    const ckpt::CheckpointSummary& s = (*listed)[i];
    CHECK_OR_FAIL(s.step == expected[i], s.step);
    Note(absl::StrCat("step ", s.step, ": ", s.manifest_status.ToString(), " ", ckpt::CheckpointKindName(s.kind), " ",
                      s.tensor_count,
                      " tensors"));
    if (s.manifest_status.ok()) CheckGoodSummary(root, s);
    auto alone = ckpt::SummarizeCheckpoint(root, s.step);
    CHECK_OR_FAIL(alone.ok(), alone.status().ToString());
    CHECK_OR_FAIL(SameSummary(s, *alone), "ListCheckpoints and SummarizeCheckpoint differ on step ", s.step,
                  ": ", s.manifest_status.ToString(), " vs ", alone->manifest_status.ToString());
    summaries[s.step] = s;
  }
  std::set<int64_t> probes = tree.named_steps();
  if (explicit_step.has_value()) probes.insert(*explicit_step);
  for (int64_t step : probes) {
    if (std::binary_search(expected.begin(), expected.end(), step)) continue;
    auto s = ckpt::SummarizeCheckpoint(root, step);
    CHECK_OR_FAIL(!s.ok() || !s->manifest_status.ok(), "unlisted step ", step, " has a good summary");
  }

  CheckLatest(root);
  CheckReader(root, flags, explicit_step, expected, summaries);

  const auto after = Snapshot(tree.base());
  if (after != before) {
    for (const auto& [path, what] : after) {
      auto it = before.find(path);
      if (it == before.end() || it->second != what)
        std::fprintf(stderr, "changed: %s %s\n", path.c_str(), what.c_str());
    }
    for (const auto& [path, what] : before) {
      if (after.count(path) == 0) std::fprintf(stderr, "gone: %s\n", path.c_str());
    }
    Fail("the read-only calls changed the tree");
  }
  return 0;
}
