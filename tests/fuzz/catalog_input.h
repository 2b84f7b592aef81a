// The input format of fuzz_catalog: bytes that describe a small checkpoint
// root. fuzz_catalog.cc decodes it (and materializes it on disk);
// fuzz_catalog_seeds.cc encodes real roots saved by the engine into it.
//
//   Input    := Options Entry*                      (at most kMaxEntries)
//   Options  := u8 flags [i64 step, if (flags >> 5) & 3 == kStepExplicit]
//   Entry    := u8 kind, Dir, then by kind % 8:
//     kFile             File Segments   regular file Dir/File
//     kManifest         Body            Dir/MANIFEST.json: Body + checksum trailer
//     kFileLinked       File Segments   Dir/File is a symlink to a regular file
//                                       outside the root holding Segments
//     kManifestLinked   Body            Dir/MANIFEST.json is such a symlink
//     kEmptyDir                         Dir, nothing in it (unless later entries)
//     kDirLinked                        Dir is a symlink to a directory outside
//                                       the root; later entries into Dir land there
//     kOddSymlink       File Bytes8     Dir/File a symlink to the text Bytes8
//     kFifo             File            Dir/File a FIFO
//   Dir      := u8 sel, then by sel % 8:
//     kRoot             -               the root itself
//     kStep             u8 step         CheckpointDirName(step)
//     kStep64           i64 step        CheckpointDirName(step), any int64
//     kTemp             u8 step u8 n    TempDirName(step, n)
//     kTrash            u8 step         ".trash-" CheckpointDirName(step) "-0000000000000001"
//     kStepRaw          20 bytes        "step-" followed by the bytes
//     kRawName          Bytes8          the bytes
//     kStepSuffix       u8 step u8 c    CheckpointDirName(step) followed by byte c
//   File     := u8 sel, then by sel % 4: MANIFEST.json | LATEST | Bytes8 | MANIFEST.json.tmp
//   Segments := u8 count, count * (u16 zeros, u16 length, bytes): the file is
//               each segment's zeros then its bytes, in order
//   Body     := u16 length, bytes; every "$PREV" in it becomes the 16-hex
//               checksum of the previous kManifest/kManifestLinked body (how a
//               delta names its base), "0000000000000000" for the first
//   Bytes8   := u8 length, bytes
// Integers are little-endian. Names are made safe for one path component
// ('/' and NUL become '_', "", "." and ".." become "_"). Input that ends
// early ends the entry list; an entry that cannot be made (its name is taken,
// its Dir is not a directory) is skipped.
#ifndef CKPT_TESTS_FUZZ_CATALOG_INPUT_H_
#define CKPT_TESTS_FUZZ_CATALOG_INPUT_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace ckpt::fuzz {

inline constexpr size_t kMaxEntries = 16;
// The most bytes (zeros included) the materialized files may hold in all.
inline constexpr uint64_t kMaxTreeBytes = uint64_t{1} << 20;
inline constexpr absl::string_view kPrevToken = "$PREV";

enum EntryKind : uint8_t {
  kFile = 0,
  kManifest,
  kFileLinked,
  kManifestLinked,
  kEmptyDir,
  kDirLinked,
  kOddSymlink,
  kFifo,
};

enum DirSel : uint8_t {
  kRoot = 0,
  kStep,
  kStep64,
  kTemp,
  kTrash,
  kStepRaw,
  kRawName,
  kStepSuffix,
};

enum FileSel : uint8_t {
  kManifestName = 0,
  kLatestName,
  kRawFileName,
  kManifestTmpName,
};

// Options flags: bit 0 O_DIRECT kAuto (else kOff); bits 1-2 chunk_bytes
// 4 KiB << {0, 1, 2, 4}; bits 3-4 queue_depth {1, 2, 4, 8}; bits 5-6 which
// step Reader::Open is asked for (StepMode); bit 7 buffer_bytes one chunk
// (else 256 KiB).
enum StepMode : uint8_t {
  kStepNewest = 0,   // options.step unset
  kStepLastListed,   // the largest step ListSteps returns
  kStepFirstListed,  // the smallest
  kStepExplicit,     // an i64 that follows the flags
};

// Appends the encoding of entries; see the grammar above.
class CatalogInputWriter {
 public:
  explicit CatalogInputWriter(uint8_t flags) { U8(flags); }

  std::string& bytes() { return out_; }

  void U8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void U16(uint16_t v) {
    U8(v & 0xff);
    U8(v >> 8);
  }
  void I64(int64_t v) {
    for (int i = 0; i < 8; ++i) U8(static_cast<uint8_t>(static_cast<uint64_t>(v) >> (8 * i)));
  }
  void Bytes8(absl::string_view s) {
    U8(static_cast<uint8_t>(s.size()));
    out_.append(s.data(), s.size() & 0xff);
  }
  void Body(absl::string_view s) {
    U16(static_cast<uint16_t>(s.size()));
    out_.append(s.data(), s.size() & 0xffff);
  }
  // File contents as segments: runs of at least 64 zero bytes become a
  // segment's zeros.
  void Segments(absl::string_view contents);
  // The Dir of a step directory: kStep for steps < 256, else kStep64.
  void StepDir(int64_t step) {
    if (step >= 0 && step < 256) {
      U8(kStep);
      U8(static_cast<uint8_t>(step));
    } else {
      U8(kStep64);
      I64(step);
    }
  }

 private:
  std::string out_;
};

inline void CatalogInputWriter::Segments(absl::string_view contents) {
  std::string body;
  size_t count = 0, i = 0;
  while (i < contents.size() && count < 255) {
    // Leading zeros: a run of 64 or more (or one that ends the file).
    size_t zeros = 0;
    while (i + zeros < contents.size() && contents[i + zeros] == '\0' && zeros < 0xffff) ++zeros;
    if (zeros < 64 && i + zeros < contents.size()) zeros = 0;
    // Then data, up to the next run of 64 zeros.
    const size_t begin = i + zeros;
    size_t end = begin, run = 0;
    while (end < contents.size() && end - begin < 0xffff) {
      run = contents[end++] == '\0' ? run + 1 : 0;
      if (run == 64) {
        end -= 64;
        break;
      }
    }
    for (size_t v : {zeros, end - begin}) {
      body.push_back(static_cast<char>(v & 0xff));
      body.push_back(static_cast<char>(v >> 8));
    }
    body.append(contents.data() + begin, end - begin);
    ++count;
    i = end;
  }
  U8(static_cast<uint8_t>(count));
  out_ += body;
}

}  // namespace ckpt::fuzz

#endif  // CKPT_TESTS_FUZZ_CATALOG_INPUT_H_
