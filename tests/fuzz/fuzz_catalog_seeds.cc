// Writes the seed corpus of fuzz_catalog into DIR/fuzz_catalog/: checkpoint
// roots saved by ckpt::Engine at seed time (a full checkpoint plus an exact
// delta on it, raw records; a full plus top-k deltas, zstd records; each
// with LATEST and the writer lock file), encoded as catalog_input.h
// describes (manifests without their checksum trailer, a delta's base
// checksum as "$PREV"), and variants of them: a save temp and a trash
// directory beside them, the delta's directory or a manifest behind a
// symlink, a shard replaced by a FIFO, a step past 2^32, other reader
// options.
//   fuzz_catalog_seeds DIR
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "catalog_input.h"
#include "ckpt/catalog.h"
#include "ckpt/engine.h"
#include "format/names.h"
#include "util/hash.h"

namespace {

using namespace ckpt;
using namespace ckpt::fuzz;
namespace fs = std::filesystem;

struct FileEntry {
  std::string dir;  // "" for the root
  std::string name;
  std::string contents;
};

std::string ReadFile(const fs::path& path) {
  std::ifstream file(path, std::ios::binary);
  std::stringstream bytes;
  bytes << file.rdbuf();
  return bytes.str();
}

// The files of `root` (one level of directories), sorted: step directories
// ascending, so that a base's manifest comes before its delta's.
std::vector<FileEntry> ReadRoot(const fs::path& root) {
  std::vector<FileEntry> files;
  for (const auto& entry : fs::directory_iterator(root)) {
    const std::string name = entry.path().filename();
    if (entry.is_directory()) {
      for (const auto& file : fs::directory_iterator(entry.path())) {
        files.push_back({name, file.path().filename(), ReadFile(file.path())});
      }
    } else {
      files.push_back({"", name, ReadFile(entry.path())});
    }
  }
  std::sort(files.begin(), files.end(), [](const FileEntry& a, const FileEntry& b) {
    return std::tie(a.dir, a.name) < std::tie(b.dir, b.name);
  });
  return files;
}

// Per-file choice of a variant: the entry kind to encode it as, or -1 to
// leave it out.
using KindOf = std::function<int(const FileEntry&)>;

int DefaultKind(const FileEntry& f) { return f.name == internal::kManifestName ? kManifest : kFile; }

void EncodeDir(CatalogInputWriter& w, const std::string& dir) {
  if (dir.empty()) {
    w.U8(kRoot);
  } else if (auto step = internal::ParseCheckpointDirName(dir)) {
    w.StepDir(*step);
  } else {
    w.U8(kRawName);
    w.Bytes8(dir);
  }
}

void EncodeFileName(CatalogInputWriter& w, const std::string& name) {
  if (name == internal::kManifestName) {
    w.U8(kManifestName);
  } else if (name == internal::kLatestName) {
    w.U8(kLatestName);
  } else {
    w.U8(kRawFileName);
    w.Bytes8(name);
  }
}

// Appends `files` to `w`, each as `kind_of` says. Manifest bodies lose
// their trailer, and the previous manifest's checksum becomes "$PREV".
void EncodeFiles(CatalogInputWriter& w, const std::vector<FileEntry>& files, const KindOf& kind_of) {
  std::string prev_hash = "0000000000000000";
  for (const FileEntry& f : files) {
    const int kind = kind_of(f);
    std::string body;
    if (f.name == internal::kManifestName) {
      body = f.contents.substr(0, f.contents.rfind(",\n \"manifest_xxh3\""));
      const std::string hash = internal::HashToHex(internal::Xxh3(body.data(), body.size()));
      body = absl::StrReplaceAll(body, {{prev_hash, kPrevToken}});
      prev_hash = hash;
    }
    if (kind < 0) continue;
    w.U8(static_cast<uint8_t>(kind));
    EncodeDir(w, f.dir);
    switch (kind) {
      case kManifest:
      case kManifestLinked: w.Body(body); break;
      case kFifo: EncodeFileName(w, f.name); break;
      default:
        EncodeFileName(w, f.name);
        w.Segments(f.contents);
        break;
    }
  }
}

std::vector<uint8_t> Pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> bytes(n);
  for (size_t i = 0; i < n; ++i) {
    seed = seed * 1664525u + 1013904223u;
    bytes[i] = static_cast<uint8_t>(seed >> 24);
  }
  return bytes;
}

struct OwnedTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
  TensorView view() const {
    TensorView v;
    v.name = name;
    v.dtype = dtype;
    v.shape = shape;
    v.data = bytes.data();
    v.nbytes = bytes.size();
    return v;
  }
};

// Saves `steps` (the first full, the rest deltas where the engine finds them
// smaller) of small tensors that change a little each step into `root`.
absl::Status SaveRoot(const std::string& root, const std::vector<int64_t>& steps, int compression,
                      DeltaOptions::Mode mode) {
  EngineOptions options;
  options.io.backend = IoBackend::kThreads;
  options.io.direct = DirectIoMode::kOff;
  options.io.chunk_bytes = 64 << 10;
  options.io.queue_depth = 4;
  options.staging_bytes = 0;
  options.shard_min_bytes = 4096;
  options.compression_level = compression;
  options.delta.mode = mode;
  options.delta.topk_ratio = 0.05;
  auto engine = Engine::Open(root, options);
  if (!engine.ok()) return engine.status();
  std::vector<OwnedTensor> tensors = {
      // Over 4 KiB: its records span a block boundary.
      {"enc.w", DType::kFloat32, {16, 80}, Pattern(5120, 1)},
      {"enc.b", DType::kBFloat16, {16}, Pattern(32, 2)},
      {"dec.w", DType::kFloat16, {300}, std::vector<uint8_t>(600, 0)},
      {"dec.scale", DType::kFloat64, {}, Pattern(8, 3)},
      {"dec.empty", DType::kInt32, {0, 4}, {}},
  };
  for (size_t i = 0; i < 600; i += 7) tensors[2].bytes[i] = static_cast<uint8_t>(i);
  for (int64_t step : steps) {
    std::vector<TensorView> views;
    for (const OwnedTensor& t : tensors) views.push_back(t.view());
    auto saved = (*engine)->Save(step, views, absl::StrCat(R"({"step": )", step, R"(, "lr": 0.5})"));
    if (!saved.ok()) return saved.status();
    // The point of these roots: a full checkpoint and deltas on it.
    const CheckpointKind expected = step == steps.front() ? CheckpointKind::kFull : CheckpointKind::kDelta;
    if (saved->kind != expected) {
      return absl::InternalError(
          absl::StrCat("step ", step, " was saved as ", saved->kind ? CheckpointKindName(*saved->kind) : "none",
                       ", not ", CheckpointKindName(expected)));
    }
    // A few elements change between steps.
    for (size_t i = 0; i < tensors[0].bytes.size(); i += 97) tensors[0].bytes[i] ^= 0x5a;
    tensors[2].bytes[10] ^= 1;
  }
  return (*engine)->Close();
}

void Write(const fs::path& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_catalog_seeds DIR\n");
    return 2;
  }
  setenv("CKPT_LOG", "warning", /*overwrite=*/0);
  const fs::path out = fs::path(argv[1]) / "fuzz_catalog";
  fs::create_directories(out);
  std::string scratch = (fs::temp_directory_path() / "ckpt-fuzz-catalog-seeds-XXXXXX").string();
  if (mkdtemp(scratch.data()) == nullptr) {
    std::perror("fuzz_catalog_seeds: mkdtemp");
    return 1;
  }
  struct Root {
    std::string name;
    std::vector<int64_t> steps;
    int compression;
    DeltaOptions::Mode mode;
  };
  const Root roots[] = {{"exact", {1, 2}, 0, DeltaOptions::Mode::kExact},
                        {"topk", {3, 4, 5}, 3, DeltaOptions::Mode::kTopK}};
  int status = 0, n = 0;
  for (const Root& r : roots) {
    const std::string root = absl::StrCat(scratch, "/", r.name);
    if (absl::Status s = SaveRoot(root, r.steps, r.compression, r.mode); !s.ok()) {
      std::fprintf(stderr, "fuzz_catalog_seeds: saving %s: %s\n", root.c_str(), s.ToString().c_str());
      status = 1;
      break;
    }
    const std::vector<FileEntry> files = ReadRoot(root);
    const std::string last_dir = StepDirName(r.steps.back());
    const std::string first_dir = StepDirName(r.steps.front());
    auto emit = [&](uint8_t flags, const std::function<void(CatalogInputWriter&)>& body) {
      CatalogInputWriter w(flags);
      body(w);
      Write(out / absl::StrCat(r.name, "-", n++), w.bytes());
    };
    // As saved, with several reader options: newest (buffered, O_DIRECT
    // probe), the last listed step, the first listed step with tiny buffers.
    for (uint8_t flags : {0x00, 0x1b, 0x20, 0xc2}) {
      emit(flags, [&](CatalogInputWriter& w) { EncodeFiles(w, files, DefaultKind); });
    }
    // An explicit step: the first one, and one that is not there.
    for (int64_t step : {r.steps.front(), int64_t{77}}) {
      CatalogInputWriter w(0x60);
      w.I64(step);
      EncodeFiles(w, files, DefaultKind);
      Write(out / absl::StrCat(r.name, "-", n++), w.bytes());
    }
    // A save in progress and a removal in progress beside the checkpoints:
    // copies of the last step under temp and trash names; LATEST naming a
    // step whose directory is gone.
    emit(0x00, [&](CatalogInputWriter& w) {
      EncodeFiles(w, files, DefaultKind);
      std::vector<FileEntry> temp, trash;
      for (const FileEntry& f : files) {
        if (f.dir != last_dir) continue;
        temp.push_back({internal::TempDirName(r.steps.back() + 1, 0xabc), f.name, f.contents});
        trash.push_back({absl::StrCat(".trash-", last_dir, "-0000000000000001"), f.name, f.contents});
      }
      EncodeFiles(w, temp, DefaultKind);
      EncodeFiles(w, trash, DefaultKind);
    });
    // The newest step behind a symlink to a directory outside the root.
    emit(0x00, [&](CatalogInputWriter& w) {
      w.U8(kDirLinked);
      w.StepDir(r.steps.back());
      EncodeFiles(w, files, DefaultKind);
    });
    // The first (full) step's manifest and shards behind symlinks.
    emit(0x00, [&](CatalogInputWriter& w) {
      EncodeFiles(w, files, [&](const FileEntry& f) {
        if (f.dir != first_dir) return DefaultKind(f);
        return f.name == internal::kManifestName ? int{kManifestLinked} : int{kFileLinked};
      });
    });
    // A shard of the newest step is a FIFO; LATEST is a symlink.
    emit(0x00, [&](CatalogInputWriter& w) {
      bool fifo = false;
      EncodeFiles(w, files, [&](const FileEntry& f) {
        if (f.dir == last_dir && f.name != internal::kManifestName && !fifo) {
          fifo = true;
          return int{kFifo};
        }
        if (f.name == internal::kLatestName) return int{kFileLinked};
        return DefaultKind(f);
      });
    });
    // The first (full) step's files also as step 2^40 (a kStep64 name),
    // its manifest saying so; and an empty step directory.
    emit(0x00, [&](CatalogInputWriter& w) {
      constexpr int64_t kBigStep = int64_t{1} << 40;
      EncodeFiles(w, files, DefaultKind);
      w.U8(kEmptyDir);
      w.StepDir(200);
      for (const FileEntry& f : files) {
        if (f.dir != first_dir) continue;
        w.U8(static_cast<uint8_t>(DefaultKind(f)));
        w.U8(kStep64);
        w.I64(kBigStep);
        if (f.name == internal::kManifestName) {
          std::string body = f.contents.substr(0, f.contents.rfind(",\n \"manifest_xxh3\""));
          body = absl::StrReplaceAll(body, {{absl::StrCat("\"step\": ", r.steps.front(), ","),
                                             absl::StrCat("\"step\": ", kBigStep, ",")}});
          w.Body(body);
        } else {
          EncodeFileName(w, f.name);
          w.Segments(f.contents);
        }
      }
    });
  }
  std::error_code ec;
  fs::remove_all(scratch, ec);
  if (status == 0) std::fprintf(stderr, "fuzz_catalog_seeds: %d seeds in %s\n", n, out.c_str());
  return status;
}
