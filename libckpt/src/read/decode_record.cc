#include "read/decode_record.h"

#include <algorithm>
#include <memory>
#include <span>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codec/record_codecs.h"
#include "format/names.h"
#include "io/io_executor.h"
#include "util/hash.h"
#include "util/mutex.h"
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

namespace {

// The bytes a read of `t`'s stored record transfers: rounded up to whole
// O_DIRECT blocks when its shard is open for direct I/O.
uint64_t StoredReadLength(File* file, const TensorInfo& t) {
  return file->direct() ? AlignUp(t.stored_bytes, kDirectIoAlignment) : t.stored_bytes;
}

// Reads the `t.stored_bytes` stored bytes of `t`'s record into `into` (room
// for `StoredReadLength`, O_DIRECT-aligned), unchecked.
absl::Status ReadStoredBytes(ShardFiles& files, const std::string& dir, const TensorInfo& t, void* into) {
  CKPT_ASSIGN_OR_RETURN(File * file, files.Get(dir, t.shard));
  const uint64_t length = StoredReadLength(file, t);
  IoExecutor io(files.queue(), files.io().chunk_bytes);
  files.CountRead(length);
  CKPT_RETURN_IF_ERROR(io.Start(IoOp::Kind::kRead, file, t.offset, into, length, 0, -1, t.stored_bytes));
  return io.Drain();
}

// Decodes the compressed full record `stored` of `t` into `dst`. The
// stored bytes are hashed only when the decoder fails: a stored checksum that
// disagrees names the cause better than the decoder's complaint.
absl::Status DecodeStoredBytes(const std::string& dir, const TensorInfo& t, const char* stored, char* dst,
                               WorkerPool* pool) {
  const RecordCodec& codec = CodecOf(t.encoding);
  absl::Status decoded = codec.decode(stored, t.stored_bytes, dst, t.raw_bytes, t.dtype, pool);
  if (decoded.ok()) return absl::OkStatus();
  CKPT_RETURN_IF_ERROR(CheckStoredBytes(dir, t, stored));
  return absl::DataLossError(absl::StrCat("tensor \"", t.name, "\" in shard ", JoinPath(dir, t.shard),
                                          " at offset ", t.offset, ": ", codec.name, " record: ",
                                          decoded.message()));
}

// `DecodeStoredBytes`, then the result checked against `t.xxh3` (and, when
// that fails, the stored bytes against `t.stored_xxh3`, to name the cause).
absl::Status DecodeStored(const std::string& dir, const TensorInfo& t, const char* stored, char* dst,
                          WorkerPool* pool) {
  CKPT_RETURN_IF_ERROR(DecodeStoredBytes(dir, t, stored, dst, pool));
  const uint64_t actual = Xxh3(dst, t.raw_bytes);
  if (actual != t.xxh3) {
    CKPT_RETURN_IF_ERROR(CheckStoredBytes(dir, t, stored));
    return ChecksumMismatch(dir, t, actual);
  }
  return absl::OkStatus();
}

// `t`'s stored bytes, read into memory of their own, unchecked.
absl::StatusOr<AlignedBytes> ReadStoredUnchecked(ShardFiles& files, const std::string& dir,
                                                 const TensorInfo& t) {
  CKPT_ASSIGN_OR_RETURN(File * file, files.Get(dir, t.shard));
  CKPT_ASSIGN_OR_RETURN(AlignedBytes stored, AlignedBytes::Allocate(StoredReadLength(file, t), false));
  CKPT_RETURN_IF_ERROR(ReadStoredBytes(files, dir, t, stored.data()));
  return stored;
}

absl::Status RequireCompressed(const TensorInfo& t) {
  const RecordCodec& codec = CodecOf(t.encoding);
  if (codec.is_compressed) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("tensor \"", t.name, "\": ", codec.name,
                                          " is not a compressed full record"));
}

}  // namespace

absl::StatusOr<AlignedBytes> ReadStoredRecord(ShardFiles& files, const std::string& dir,
                                              const TensorInfo& t) {
  CKPT_ASSIGN_OR_RETURN(AlignedBytes stored, ReadStoredUnchecked(files, dir, t));
  CKPT_RETURN_IF_ERROR(CheckStoredBytes(dir, t, static_cast<const char*>(stored.data())));
  return stored;
}

absl::Status DecodeCompressedRecord(ShardFiles& files, const std::string& dir, const TensorInfo& t,
                                    char* dst) {
  CKPT_RETURN_IF_ERROR(RequireCompressed(t));
  CKPT_ASSIGN_OR_RETURN(AlignedBytes stored, ReadStoredUnchecked(files, dir, t));
  // Only checking: decoded into memory of its own, dropped after.
  AlignedBytes scratch;
  if (dst == nullptr) {
    CKPT_ASSIGN_OR_RETURN(scratch, AlignedBytes::Allocate(t.raw_bytes, false));
    dst = static_cast<char*>(scratch.data());
  }
  return DecodeStored(dir, t, static_cast<const char*>(stored.data()), dst, files.codec_pool());
}

absl::Status DecodeCompressedRecords(ShardFiles& files, std::span<const RecordTarget> records) {
  if (records.size() == 1) {
    return DecodeCompressedRecord(files, *records[0].dir, *records[0].info, records[0].dst);
  }
  if (records.empty()) return absl::OkStatus();
  // The stored bytes of the records in flight share one ring of memory, of
  // twice the largest record, allocated once: records take their room in
  // turn, wrapping to the start where the end is too short, and give it back
  // once decoded. So while a large record decodes, the reader goes on with
  // the next ones in the room left (two buffers of one record each stalled
  // the reader on every large record, and the decoder on every small run).
  std::vector<uint64_t> lengths(records.size());
  uint64_t largest = 0;
  for (size_t i = 0; i < records.size(); ++i) {
    const RecordTarget& r = records[i];
    CKPT_RETURN_IF_ERROR(RequireCompressed(*r.info));
    CKPT_ASSIGN_OR_RETURN(File * file, files.Get(*r.dir, r.info->shard));
    lengths[i] = AlignUp(std::max<uint64_t>(StoredReadLength(file, *r.info), 1), kDirectIoAlignment);
    largest = std::max(largest, lengths[i]);
  }
  const uint64_t ring_bytes = 2 * largest;
  CKPT_ASSIGN_OR_RETURN(AlignedBytes ring, AlignedBytes::Allocate(ring_bytes, false));
  char* const ring_base = static_cast<char*>(ring.data());
  std::vector<uint64_t> starts(records.size());  // each record's room in the ring
  WorkerPool* pool = files.codec_pool();
  // Three stages, each on its own thread, record after record: this one
  // reads, the decoder decodes (blocks on the pool), the hasher checks the
  // decoded value (one XXH3 stream per record, serial) while the next record
  // decodes. A stored checksum is checked only where decoding fails: a
  // record's room is reused once it is decoded.
  Mutex mu;
  size_t read = 0;     // records whose stored bytes are in the ring
  size_t decoded = 0;  // records decoded (their room free again)
  absl::Status failed;  // the first failure, of any stage
  auto fail = [&](absl::Status s) {  // REQUIRES: mu held
    if (!s.ok() && failed.ok()) failed = std::move(s);
  };
  // Whether [begin, end) of the ring is clear of every record read and not
  // yet decoded (those before `i`). REQUIRES: mu held.
  auto room_free = [&](size_t i, uint64_t begin, uint64_t end) {
    for (size_t j = decoded; j < i; ++j) {
      if (starts[j] < end && begin < starts[j] + lengths[j]) return false;
    }
    return true;
  };
  std::thread decoder([&] {
    for (size_t i = 0; i < records.size(); ++i) {
      {
        MutexLock lock(&mu);
        mu.Await([&] { return read > i || !failed.ok(); });
        if (!failed.ok()) return;
      }
      const RecordTarget& r = records[i];
      absl::Status s = DecodeStoredBytes(*r.dir, *r.info, ring_base + starts[i], r.dst, pool);
      MutexLock lock(&mu);
      fail(std::move(s));
      if (!failed.ok()) return;
      ++decoded;
    }
  });
  std::thread hasher([&] {
    for (size_t i = 0; i < records.size(); ++i) {
      {
        MutexLock lock(&mu);
        mu.Await([&] { return decoded > i || !failed.ok(); });
        if (!failed.ok()) return;
      }
      const TensorInfo& t = *records[i].info;
      const uint64_t actual = Xxh3(records[i].dst, t.raw_bytes);
      if (actual != t.xxh3) {
        MutexLock lock(&mu);
        fail(ChecksumMismatch(*records[i].dir, t, actual));
        return;
      }
    }
  });
  uint64_t next = 0;  // where the next record's room begins, unless it wraps
  for (size_t i = 0; i < records.size(); ++i) {
    const uint64_t begin = next + lengths[i] <= ring_bytes ? next : 0;
    {
      MutexLock lock(&mu);
      // (Once every record before i is decoded the whole ring is free.)
      mu.Await([&] { return room_free(i, begin, begin + lengths[i]) || !failed.ok(); });
      if (!failed.ok()) break;
      starts[i] = begin;
    }
    next = begin + lengths[i];
    const RecordTarget& r = records[i];
    absl::Status s = ReadStoredBytes(files, *r.dir, *r.info, ring_base + begin);
    MutexLock lock(&mu);
    fail(std::move(s));
    if (!failed.ok()) break;
    ++read;
  }
  decoder.join();
  hasher.join();
  return failed;
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
