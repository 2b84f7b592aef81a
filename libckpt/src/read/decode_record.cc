#include "read/decode_record.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codec/record_codecs.h"
#include "format/names.h"
#include "io/io_executor.h"
#include "util/hash.h"
#include "util/status_macros.h"
#include "ckpt/file_system.h"

namespace ckpt::internal {

absl::Status ChecksumMismatch(const std::string& dir, const TensorInfo& t, uint64_t actual) {
  return absl::DataLossError(absl::StrCat(
      "tensor \"", t.name, "\" in shard ", JoinPath(dir, t.shard), " at offset ", t.offset,
      ": checksum mismatch (manifest ", HashToHex(t.xxh3), ", data ", HashToHex(actual), ")"));
}

absl::Status StoredChecksumMismatch(const std::string& dir, const TensorInfo& t, uint64_t actual) {
  return absl::DataLossError(absl::StrCat(
      "tensor \"", t.name, "\" in shard ", JoinPath(dir, t.shard), " at offset ", t.offset,
      ": checksum mismatch of its ", t.stored_bytes, " stored bytes (", RecordEncodingName(t.encoding),
      " record; manifest stored_xxh3 ", HashToHex(*t.stored_xxh3), ", data ", HashToHex(actual), ")"));
}

absl::Status CheckStoredBytes(const std::string& dir, const TensorInfo& t, const char* stored) {
  if (!t.stored_xxh3.has_value()) return absl::OkStatus();
  const uint64_t actual = Xxh3(stored, t.stored_bytes);
  if (actual != *t.stored_xxh3) return StoredChecksumMismatch(dir, t, actual);
  return absl::OkStatus();
}

absl::StatusOr<AlignedBytes> ReadStoredRecord(ShardFiles& files, const std::string& dir,
                                              const TensorInfo& t) {
  CKPT_ASSIGN_OR_RETURN(File * file, files.Get(dir, t.shard));
  const uint64_t length = file->direct() ? AlignUp(t.stored_bytes, kDirectIoAlignment) : t.stored_bytes;
  CKPT_ASSIGN_OR_RETURN(AlignedBytes stored, AlignedBytes::Allocate(length, false));
  IoExecutor io(files.queue(), files.io().chunk_bytes);
  files.CountRead(length);
  CKPT_RETURN_IF_ERROR(io.Start(IoOp::Kind::kRead, file, t.offset, stored.data(), length, 0, -1,
                                t.stored_bytes));
  CKPT_RETURN_IF_ERROR(io.Drain());
  CKPT_RETURN_IF_ERROR(CheckStoredBytes(dir, t, static_cast<const char*>(stored.data())));
  return stored;
}

absl::Status DecodeCompressedRecord(ShardFiles& files, const std::string& dir, const TensorInfo& t,
                                    char* dst) {
  const RecordCodec& codec = CodecOf(t.encoding);
  if (!codec.is_compressed) {
    return absl::InternalError(absl::StrCat("tensor \"", t.name, "\": ", codec.name,
                                            " is not a compressed full record"));
  }
  CKPT_ASSIGN_OR_RETURN(AlignedBytes stored, ReadStoredRecord(files, dir, t));
  // Only checking: decoded into memory of its own, dropped after.
  AlignedBytes scratch;
  if (dst == nullptr) {
    CKPT_ASSIGN_OR_RETURN(scratch, AlignedBytes::Allocate(t.raw_bytes, false));
    dst = static_cast<char*>(scratch.data());
  }
  absl::Status decoded = codec.decode(static_cast<const char*>(stored.data()), t.stored_bytes, dst,
                                      t.raw_bytes, t.dtype, files.codec_pool());
  if (!decoded.ok()) {
    return absl::DataLossError(absl::StrCat("tensor \"", t.name, "\" in shard ", JoinPath(dir, t.shard),
                                            " at offset ", t.offset, ": ", codec.name, " record: ",
                                            decoded.message()));
  }
  const uint64_t actual = Xxh3(dst, t.raw_bytes);
  if (actual != t.xxh3) return ChecksumMismatch(dir, t, actual);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<const TensorInfo*>> DeltaLinksOf(const DeltaChain& chain,
                                                            absl::string_view name, size_t base) {
  const TensorInfo* first = chain.Find(base, name);
  std::vector<const TensorInfo*> links;
  for (size_t l = base + 1; l < chain.size(); ++l) {
    const TensorInfo* t = chain.Find(l, name);
    if (t == nullptr || first == nullptr || t->dtype != first->dtype || t->shape != first->shape) {
      return absl::DataLossError(absl::StrCat(
          "tensor \"", name, "\" changes dtype or shape along the delta chain of ",
          chain.opened().dir));
    }
    links.push_back(t);
  }
  return links;
}

absl::Status ApplyDeltas(ShardFiles& files, const DeltaChain& chain, absl::string_view name,
                         size_t base, char* dst) {
  CKPT_ASSIGN_OR_RETURN(std::vector<const TensorInfo*> links, DeltaLinksOf(chain, name, base));
  for (size_t l = base + 1; l < chain.size(); ++l) {
    const TensorInfo* t = links[l - base - 1];
    const std::string& dir = chain.link(l).dir;
    CKPT_ASSIGN_OR_RETURN(AlignedBytes stored, ReadStoredRecord(files, dir, *t));
    absl::Status applied = CodecOf(t->encoding).decode(static_cast<const char*>(stored.data()),
                                                       t->stored_bytes, dst, t->raw_bytes, t->dtype,
                                                       /*pool=*/nullptr);
    if (!applied.ok()) {
      return absl::DataLossError(absl::StrCat("tensor \"", name, "\" in shard ",
                                              JoinPath(dir, t->shard), " at offset ", t->offset,
                                              ": ", applied.message()));
    }
    const uint64_t actual = Xxh3(dst, t->raw_bytes);
    if (actual != t->xxh3) return ChecksumMismatch(dir, *t, actual);
  }
  return absl::OkStatus();
}

}  // namespace ckpt::internal
