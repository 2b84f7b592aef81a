// ckpt/kinds.h: what a checkpoint is and how its records are stored, as
// enums, with the names the manifest and every printed form use.
#ifndef CKPT_KINDS_H_
#define CKPT_KINDS_H_

#include <cstdint>
#include <optional>
#include <ostream>

#include "absl/strings/string_view.h"

namespace ckpt {

enum class CheckpointKind : uint8_t {
  kFull,   // every tensor stored whole
  kDelta,  // some tensors stored against the same tensor of a base step
};

// How one record stores its tensor (docs/format.md, the `encoding` table).
enum class RecordEncoding : uint8_t {
  kRaw,     // the tensor's bytes
  kZstd,    // the tensor's bytes, zstd-compressed
  kSparse,  // delta: the changed elements, exact
  kXor,     // delta: XOR against the base, zstd-compressed, exact
  kTopK,    // delta: the k largest changes only, lossy
  kPlanes,     // the tensor's bytes grouped by significance (byte planes), each plane zstd
  kXorPlanes,  // delta: XOR against the base grouped into byte planes, each plane zstd, exact
};

// "full", "delta".
absl::string_view CheckpointKindName(CheckpointKind kind);
std::optional<CheckpointKind> ParseCheckpointKind(absl::string_view name);

// "raw", "zstd", "sparse", "xor", "topk", "planes", "xor_planes" (each
// encoding's entry in the library's table of record codecs).
absl::string_view RecordEncodingName(RecordEncoding encoding);
std::optional<RecordEncoding> ParseRecordEncoding(absl::string_view name);

// Whether a record of `encoding` applies to the base step's tensor.
bool IsDeltaEncoding(RecordEncoding encoding);

inline std::ostream& operator<<(std::ostream& out, CheckpointKind kind) {
  return out << CheckpointKindName(kind);
}
inline std::ostream& operator<<(std::ostream& out, RecordEncoding encoding) {
  return out << RecordEncodingName(encoding);
}

}  // namespace ckpt

#endif  // CKPT_KINDS_H_
