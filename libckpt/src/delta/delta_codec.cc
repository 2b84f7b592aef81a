// Over ~400 lines on purpose: the encoders and appliers of the four delta
// encodings (sparse, xor, xor_planes, topk) share their payload layouts,
// per-thread zstd contexts and scratch, and the selection between them
// needs them all; a split (encode / apply) is the natural next cut if this
// grows.
#include "delta/delta_codec.h"

#include <zstd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>

#include "absl/strings/str_cat.h"
#include "codec/zstd_context.h"
#include "delta/plane_codec.h"
#include "util/status_macros.h"

namespace ckpt::internal {
namespace {

constexpr uint8_t kSparseTag = 1;
constexpr uint8_t kXorTag = 2;

// The selection rule of EncodeExactDelta (delta_codec.h): with c changed of
// N elements, sparse only when c <= N / kSparseChangedDenominator, dense
// only when c > N / kDenseChangedDenominator, both in between.
constexpr uint64_t kSparseChangedDenominator = 32;
constexpr uint64_t kDenseChangedDenominator = 3;

// Calls `fn(index, x_element_ptr, r_element_ptr)` for every element whose
// bits differ between X and R.
template <typename Fn>
void ForEachChanged(std::span<const Piece> x, const char* r, size_t elem, Fn fn) {
  size_t offset = 0;
  for (const Piece& p : x) {
    const char* xs = p.data;
    const char* rs = r + offset;
    size_t i = 0;
    // Skip equal 64-byte blocks fast.
    while (i < p.bytes) {
      if (i + 64 <= p.bytes && std::memcmp(xs + i, rs + i, 64) == 0) {
        i += 64;
        continue;
      }
      const size_t end = std::min(p.bytes, i + 64);
      for (; i < end; i += elem) {
        if (std::memcmp(xs + i, rs + i, elem) != 0) fn((offset + i) / elem, xs + i, rs + i);
      }
    }
    offset += p.bytes;
  }
}

void PutVarint(std::vector<char>& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

// Per-thread buffer of kChunkBytes (uninitialized), allocated once per
// thread: the unit in which xor payloads are streamed and plane blocks that
// straddle pieces are gathered.
constexpr size_t kChunkBytes = kPlaneBlockBytes;
char* ThreadChunk() {
  thread_local std::unique_ptr<char[]> chunk(new char[kChunkBytes]);
  return chunk.get();
}

// A per-thread buffer of at least `bytes` (uninitialized), grown, never
// shrunk: where sparse payloads are decompressed.
char* ThreadBuffer(size_t bytes) {
  thread_local std::unique_ptr<char[]> buffer;
  thread_local size_t capacity = 0;
  if (bytes > capacity) {
    capacity = std::max(bytes, capacity * 2);
    buffer.reset(new char[capacity]);
  }
  return buffer.get();
}

// This thread's spare output buffer (RecycleDeltaBytes): an encoder's
// output starts from it, so that a steady state of saves writes into pages
// already faulted in rather than into fresh ones (~5 s/GB on a VM).
std::vector<char>& Spare() {
  thread_local std::vector<char> spare;
  return spare;
}
std::vector<char> TakeSpare() {
  std::vector<char> v = std::move(Spare());
  Spare() = std::vector<char>();
  v.clear();
  return v;
}

absl::StatusOr<std::vector<char>> Compress(const std::vector<char>& raw, int level) {
  std::vector<char> out(ZSTD_compressBound(raw.size()));
  const size_t z = ZSTD_compressCCtx(ThreadZstdCCtx(), out.data(), out.size(), raw.data(), raw.size(), level);
  if (ZSTD_isError(z)) return absl::InternalError(absl::StrCat("zstd: ", ZSTD_getErrorName(z)));
  out.resize(z);
  return out;
}

// "sparse"/"topk" payload before compression.
std::vector<char> SparsePayload(const std::vector<uint64_t>& indices, const char* values,
                                size_t elem) {
  std::vector<char> raw;
  raw.reserve(1 + 10 + indices.size() * (2 + elem));
  raw.push_back(static_cast<char>(kSparseTag));
  PutVarint(raw, indices.size());
  uint64_t next = 0;
  for (uint64_t i : indices) {
    PutVarint(raw, i - next);
    next = i + 1;
  }
  raw.insert(raw.end(), values, values + indices.size() * elem);
  return raw;
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1F;
  uint32_t mant = h & 0x3FF;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal
      exp = 127 - 15 + 1;
      while ((mant & 0x400) == 0) mant <<= 1, --exp;
      bits = sign | (exp << 23) | ((mant & 0x3FF) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7F800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(bits);
}

double ToDouble(const char* p, DType dtype) {
  switch (dtype) {
    case DType::kFloat64: { double v; std::memcpy(&v, p, 8); return v; }
    case DType::kFloat32: { float v; std::memcpy(&v, p, 4); return v; }
    case DType::kBFloat16: { uint16_t b; std::memcpy(&b, p, 2); return std::bit_cast<float>(uint32_t{b} << 16); }
    case DType::kFloat16: { uint16_t b; std::memcpy(&b, p, 2); return HalfToFloat(b); }
    default: return 0;
  }
}

// Order-preserving key of a change's magnitude: +inf for a non-finite one.
uint64_t ChangeKey(const char* x, const char* r, DType dtype) {
  const double a = ToDouble(x, dtype);
  const double b = ToDouble(r, dtype);
  const double d = std::isfinite(a) && std::isfinite(b) ? std::fabs(a - b)
                                                         : std::numeric_limits<double>::infinity();
  return std::bit_cast<uint64_t>(d);  // non-negative doubles order like their bits
}

// Elements whose bits differ between X and R.
template <typename U>
uint64_t CountChangedT(const char* x, const char* r, size_t count) {
  uint64_t changed = 0;
  for (size_t i = 0; i < count; ++i) {
    U a, b;
    std::memcpy(&a, x + i * sizeof(U), sizeof(U));
    std::memcpy(&b, r + i * sizeof(U), sizeof(U));
    changed += a != b;
  }
  return changed;
}

uint64_t CountChanged(std::span<const Piece> x, const char* r, size_t elem) {
  uint64_t changed = 0;
  size_t offset = 0;
  for (const Piece& p : x) {
    const char* rs = r + offset;
    switch (elem) {
      case 1: changed += CountChangedT<uint8_t>(p.data, rs, p.bytes); break;
      case 2: changed += CountChangedT<uint16_t>(p.data, rs, p.bytes / 2); break;
      case 4: changed += CountChangedT<uint32_t>(p.data, rs, p.bytes / 4); break;
      case 8: changed += CountChangedT<uint64_t>(p.data, rs, p.bytes / 8); break;
      default: ForEachChanged({&p, 1}, rs, elem, [&](uint64_t, const char*, const char*) { ++changed; });
    }
    offset += p.bytes;
  }
  return changed;
}

void CopyPieces(std::span<const Piece> x, char* r) {
  size_t offset = 0;
  for (const Piece& p : x) {
    std::memcpy(r + offset, p.data, p.bytes);
    offset += p.bytes;
  }
}

// "sparse" payload, compressed: the changed elements of X.
absl::StatusOr<std::vector<char>> EncodeSparse(std::span<const Piece> x, const char* r, size_t elem,
                                               uint64_t changed, int level) {
  std::vector<uint64_t> indices;
  std::vector<char> values;
  indices.reserve(changed);
  values.reserve(changed * elem);
  ForEachChanged(x, r, elem, [&](uint64_t i, const char* xe, const char*) {
    indices.push_back(i);
    values.insert(values.end(), xe, xe + elem);
  });
  return Compress(SparsePayload(indices, values.data(), elem), level);
}

// "xor" payload: the tag then X xor R, compressed as one zstd frame (which
// declares its content size), streamed through a chunk of X xor R.
absl::StatusOr<std::vector<char>> EncodeXor(std::span<const Piece> x, const char* r, size_t n,
                                            int level) {
  ZSTD_CCtx* cctx = ThreadZstdCCtx();
  ZSTD_CCtx_reset(cctx, ZSTD_reset_session_and_parameters);
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, level);
  ZSTD_CCtx_setPledgedSrcSize(cctx, 1 + n);
  std::vector<char> out = TakeSpare();
  out.reserve(ZSTD_compressBound(1 + n));  // address space only: pages are touched as written
  thread_local std::unique_ptr<char[]> sink(new char[ZSTD_CStreamOutSize()]);
  const size_t sink_bytes = ZSTD_CStreamOutSize();
  auto feed = [&](const char* data, size_t bytes, ZSTD_EndDirective mode) -> absl::Status {
    ZSTD_inBuffer in{data, bytes, 0};
    while (true) {
      ZSTD_outBuffer o{sink.get(), sink_bytes, 0};
      const size_t left = ZSTD_compressStream2(cctx, &o, &in, mode);
      if (ZSTD_isError(left)) return absl::InternalError(absl::StrCat("zstd: ", ZSTD_getErrorName(left)));
      out.insert(out.end(), sink.get(), sink.get() + o.pos);
      if (mode == ZSTD_e_end ? left == 0 : in.pos == in.size) return absl::OkStatus();
    }
  };
  const char tag = static_cast<char>(kXorTag);
  CKPT_RETURN_IF_ERROR(feed(&tag, 1, ZSTD_e_continue));
  char* chunk = ThreadChunk();
  size_t offset = 0;
  for (const Piece& p : x) {
    for (size_t done = 0; done < p.bytes;) {
      const size_t len = std::min(kChunkBytes, p.bytes - done);
      const char* xs = p.data + done;
      const char* rs = r + offset + done;
      for (size_t i = 0; i < len; ++i) chunk[i] = xs[i] ^ rs[i];
      CKPT_RETURN_IF_ERROR(feed(chunk, len, ZSTD_e_continue));
      done += len;
    }
    offset += p.bytes;
  }
  CKPT_RETURN_IF_ERROR(feed(nullptr, 0, ZSTD_e_end));
  return out;
}

// Appends block `b` (bytes [b * kPlaneBlockBytes, ...) of the record) of X,
// or of X xor R when `r` is set, to `out`; then r's block becomes X's.
// `starts`: each piece's offset in the record.
absl::Status EncodeBlock(std::span<const Piece> x, const std::vector<size_t>& starts, char* r,
                         size_t n, size_t elem, int level, size_t b, std::vector<char>* out) {
  const size_t offset = b * kPlaneBlockBytes;
  const size_t len = std::min(kPlaneBlockBytes, n - offset);
  size_t p = static_cast<size_t>(std::upper_bound(starts.begin(), starts.end(), offset) -
                                 starts.begin()) - 1;
  const char* src;
  if (offset + len <= starts[p] + x[p].bytes) {
    src = x[p].data + (offset - starts[p]);
  } else {  // the block straddles pieces: gather it
    char* chunk = ThreadChunk();
    for (size_t done = 0; done < len; ++p) {
      const size_t from = offset + done - starts[p];
      if (from >= x[p].bytes) continue;
      const size_t take = std::min(x[p].bytes - from, len - done);
      std::memcpy(chunk + done, x[p].data + from, take);
      done += take;
    }
    src = chunk;
  }
  CKPT_RETURN_IF_ERROR(AppendPlaneBlock(src, len, elem, level, /*store_raw=*/false, out,
                                        r == nullptr ? nullptr : r + offset));
  if (r != nullptr) std::memcpy(r + offset, src, len);
  return absl::OkStatus();
}

// Blocks of X (or X xor R, and then r == X) appended to `out`, encoded on
// `pool` in waves of a few blocks per thread; each wave's blocks go to
// per-thread slots (reused from call to call), then to `out` in order.
absl::Status EncodeBlocks(std::span<const Piece> x, char* r, size_t n, size_t elem, int level,
                          WorkerPool* pool, std::vector<char>* out) {
  std::vector<size_t> starts(x.size());
  size_t total = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    starts[i] = total;
    total += x[i].bytes;
  }
  if (total != n) return absl::InvalidArgumentError("pieces do not add up to the record");
  const size_t blocks = (n + kPlaneBlockBytes - 1) / kPlaneBlockBytes;
  out->reserve(out->size() + blocks * PlaneBlockBound(kPlaneBlockBytes, elem));
  const size_t threads = pool == nullptr ? 1 : static_cast<size_t>(pool->threads());
  if (threads == 1 || blocks == 1) {
    for (size_t b = 0; b < blocks; ++b) {
      CKPT_RETURN_IF_ERROR(EncodeBlock(x, starts, r, n, elem, level, b, out));
    }
    return absl::OkStatus();
  }
  const size_t wave = 4 * threads;
  thread_local std::vector<std::vector<char>> thread_slots;
  std::vector<std::vector<char>>& slots = thread_slots;  // this thread's, for the workers
  if (slots.size() < wave) slots.resize(wave);
  std::vector<absl::Status> status(wave);
  for (size_t first = 0; first < blocks; first += wave) {
    const size_t m = std::min(wave, blocks - first);
    pool->ParallelFor(m, [&](size_t j) {
      slots[j].clear();
      status[j] = EncodeBlock(x, starts, r, n, elem, level, first + j, &slots[j]);
    });
    for (size_t j = 0; j < m; ++j) {
      CKPT_RETURN_IF_ERROR(status[j]);
      out->insert(out->end(), slots[j].begin(), slots[j].end());
    }
  }
  return absl::OkStatus();
}

// Applies an "xor" payload, streaming it through a chunk.
absl::Status ApplyXor(const char* payload, size_t payload_bytes, char* dst, size_t n) {
  const unsigned long long content = ZSTD_getFrameContentSize(payload, payload_bytes);
  if (content == ZSTD_CONTENTSIZE_ERROR || content == ZSTD_CONTENTSIZE_UNKNOWN) {
    return absl::DataLossError("xor delta: bad zstd frame header");
  }
  if (content != 1 + uint64_t{n}) return absl::DataLossError("xor delta: wrong size");
  ZSTD_DCtx* dctx = ThreadZstdDCtx();
  ZSTD_DCtx_reset(dctx, ZSTD_reset_session_only);
  ZSTD_inBuffer in{payload, payload_bytes, 0};
  char* chunk = ThreadChunk();
  uint64_t produced = 0;  // content bytes so far (the tag included)
  while (true) {
    ZSTD_outBuffer o{chunk, kChunkBytes, 0};
    const size_t left = ZSTD_decompressStream(dctx, &o, &in);
    if (ZSTD_isError(left) || produced + o.pos > 1 + uint64_t{n}) {
      return absl::DataLossError("xor delta: corrupt zstd data");
    }
    const char* data = chunk;
    size_t bytes = o.pos;
    if (produced == 0 && bytes > 0) {
      if (static_cast<uint8_t>(data[0]) != kXorTag) return absl::DataLossError("xor delta: bad tag");
      ++data, --bytes, ++produced;
    }
    const size_t at = produced - 1;
    for (size_t i = 0; i < bytes; ++i) dst[at + i] ^= data[i];
    produced += bytes;
    if (left == 0) break;  // the frame is complete
    if (in.pos == in.size && o.pos < o.size) return absl::DataLossError("xor delta: truncated");
  }
  if (produced != 1 + uint64_t{n} || in.pos != in.size) {
    return absl::DataLossError("xor delta: wrong size");
  }
  return absl::OkStatus();
}

// Applies a "sparse" or "topk" payload: decompressed into a per-thread
// buffer, checked whole, then written.
absl::Status ApplySparse(RecordEncoding encoding, const char* payload, size_t payload_bytes,
                         char* dst, size_t n, size_t elem) {
  const uint64_t numel = elem == 0 ? 0 : n / elem;
  const unsigned long long content = ZSTD_getFrameContentSize(payload, payload_bytes);
  const uint64_t limit = 1 + 10 + numel * (10 + elem);
  const std::string kind(RecordEncodingName(encoding));
  if (content == ZSTD_CONTENTSIZE_ERROR || content == ZSTD_CONTENTSIZE_UNKNOWN || content > limit) {
    return absl::DataLossError(absl::StrCat(kind, " delta: bad zstd frame header"));
  }
  if (content == 0) return absl::DataLossError(absl::StrCat(kind, " delta: empty payload"));
  char* raw = ThreadBuffer(content);
  const size_t size = content;
  const size_t got = ZSTD_decompressDCtx(ThreadZstdDCtx(), raw, size, payload, payload_bytes);
  if (ZSTD_isError(got) || got != size) {
    return absl::DataLossError(absl::StrCat(kind, " delta: corrupt zstd data"));
  }
  if (static_cast<uint8_t>(raw[0]) != kSparseTag) {
    return absl::DataLossError(absl::StrCat(kind, " delta: bad tag"));
  }
  size_t pos = 1;
  auto varint = [&](uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos >= size) return false;
      const auto b = static_cast<uint8_t>(raw[pos++]);
      *v |= uint64_t{b & 0x7Fu} << shift;
      if ((b & 0x80) == 0) return true;
    }
    return false;
  };
  uint64_t count;
  if (!varint(&count) || count > numel) return absl::DataLossError("sparse delta: bad count");
  // Pass 1 checks every index; pass 2 (over the same varints) writes.
  const size_t indices_at = pos;
  uint64_t next = 0;
  for (uint64_t j = 0; j < count; ++j) {
    uint64_t gap;
    if (!varint(&gap) || gap >= numel - next || next + gap >= numel) {
      return absl::DataLossError("sparse delta: index out of range");
    }
    next += gap + 1;
  }
  if (size - pos != count * elem) return absl::DataLossError("sparse delta: wrong value bytes");
  const char* values = raw + pos;
  pos = indices_at;
  next = 0;
  for (uint64_t j = 0; j < count; ++j) {
    uint64_t gap;
    varint(&gap);
    std::memcpy(dst + (next + gap) * elem, values + j * elem, elem);
    next += gap + 1;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DeltaRecord> EncodeExactDelta(std::span<const Piece> x, char* r, size_t n,
                                             DType dtype, int zstd_level, WorkerPool* pool) {
  const size_t elem = DTypeSize(dtype);
  const uint64_t numel = elem == 0 ? 0 : n / elem;
  DeltaRecord record;
  record.changed = CountChanged(x, r, elem);
  // Planes of each real number (a complex element's parts apart).
  const size_t plane_elem = DTypeScalarSize(dtype);
  const bool planes = plane_elem == 2 || plane_elem == 4 || plane_elem == 8;
  const bool try_sparse = record.changed * kDenseChangedDenominator <= numel;
  const bool try_dense = record.changed * kSparseChangedDenominator > numel;
  if (try_sparse) {
    CKPT_ASSIGN_OR_RETURN(record.bytes, EncodeSparse(x, r, elem, record.changed, zstd_level));
    record.encoding = RecordEncoding::kSparse;
  }
  if (try_dense && (!planes || try_sparse)) {
    // Plain xor: the dense candidate of 1-byte dtypes and, in the middle,
    // also of wider ones (partly changed tensors: zstd then codes each
    // changed position once, where planes code it once per plane).
    CKPT_ASSIGN_OR_RETURN(std::vector<char> dense, EncodeXor(x, r, n, zstd_level));
    if (!try_sparse || dense.size() < record.bytes.size()) {
      std::swap(record.bytes, dense);
      record.encoding = RecordEncoding::kXor;
    }
    RecycleDeltaBytes(std::move(dense));  // the loser's pages serve the next candidate
  }
  if (try_dense && planes) {
    std::vector<char> dense = TakeSpare();
    CKPT_RETURN_IF_ERROR(EncodeBlocks(x, r, n, plane_elem, zstd_level, pool, &dense));  // r = X
    if (!try_sparse || dense.size() < record.bytes.size()) {
      std::swap(record.bytes, dense);
      record.encoding = RecordEncoding::kXorPlanes;
    }
    RecycleDeltaBytes(std::move(dense));
    return record;
  }
  CopyPieces(x, r);  // R becomes X
  return record;
}

void RecycleDeltaBytes(std::vector<char>&& bytes) {
  if (bytes.capacity() > Spare().capacity()) Spare() = std::move(bytes);
  bytes = std::vector<char>();
}

absl::StatusOr<std::vector<char>> EncodeXorDelta(std::span<const Piece> x, const char* r, size_t n,
                                                 int zstd_level) {
  return EncodeXor(x, r, n, zstd_level);
}

absl::StatusOr<DeltaRecord> EncodeTopKDelta(std::span<const Piece> x, char* r, size_t n,
                                            DType dtype, double ratio, int zstd_level) {
  if (!IsFloatingDType(dtype)) return EncodeExactDelta(x, r, n, dtype, zstd_level);
  const size_t elem = DTypeSize(dtype);
  const uint64_t numel = n / elem;
  const uint64_t k = static_cast<uint64_t>(std::ceil(std::clamp(ratio, 0.0, 1.0) * numel));
  // Pass 1: how many changed, and a histogram of magnitudes (top 16 bits).
  std::vector<uint64_t> histogram(1 << 16, 0);
  uint64_t changed = 0;
  ForEachChanged(x, r, elem, [&](uint64_t, const char* xe, const char* re) {
    ++histogram[ChangeKey(xe, re, dtype) >> 48];
    ++changed;
  });
  // Everything kept when it fits in k; otherwise a threshold bucket.
  size_t threshold = 0;  // buckets > threshold are kept whole
  uint64_t above = 0;    // elements in them
  bool keep_all = changed <= k;
  if (!keep_all) {
    for (size_t b = histogram.size(); b > 0; --b) {
      if (above + histogram[b - 1] >= k) {
        threshold = b - 1;
        break;
      }
      above += histogram[b - 1];
    }
  }
  // Pass 2: kept indices (plus candidates of the threshold bucket).
  std::vector<uint64_t> kept;
  std::vector<std::pair<uint64_t, uint64_t>> candidates;  // (key, index)
  uint64_t dropped_max = 0;
  const uint64_t inf_key = std::bit_cast<uint64_t>(std::numeric_limits<double>::infinity());
  ForEachChanged(x, r, elem, [&](uint64_t i, const char* xe, const char* re) {
    if (keep_all) {
      kept.push_back(i);
      return;
    }
    const uint64_t key = ChangeKey(xe, re, dtype);
    const size_t bucket = key >> 48;
    if (bucket > threshold || key == inf_key) kept.push_back(i);
    else if (bucket == threshold) candidates.emplace_back(key, i);
    else dropped_max = std::max(dropped_max, key);
  });
  if (!keep_all) {
    const uint64_t want = k > kept.size() ? k - kept.size() : 0;
    if (want < candidates.size()) {
      std::nth_element(candidates.begin(), candidates.begin() + want, candidates.end(),
                       [](const auto& a, const auto& b) { return a.first > b.first; });
      for (size_t c = want; c < candidates.size(); ++c) {
        dropped_max = std::max(dropped_max, candidates[c].first);
      }
      candidates.resize(want);
    }
    for (const auto& c : candidates) kept.push_back(c.second);
    std::sort(kept.begin(), kept.end());
  }
  // Gather values, update R exactly by what is stored.
  std::vector<char> values(kept.size() * elem);
  {
    size_t piece = 0;
    size_t piece_start = 0;  // byte offset of x[piece]
    for (size_t j = 0; j < kept.size(); ++j) {
      const size_t byte = kept[j] * elem;
      while (byte >= piece_start + x[piece].bytes) piece_start += x[piece++].bytes;
      const char* src = x[piece].data + (byte - piece_start);
      std::memcpy(values.data() + j * elem, src, elem);
      std::memcpy(r + byte, src, elem);
    }
  }
  DeltaRecord record;
  record.encoding = RecordEncoding::kTopK;
  record.changed = kept.size();
  record.error_bound = std::bit_cast<double>(dropped_max);
  auto compressed = Compress(SparsePayload(kept, values.data(), elem), zstd_level);
  if (!compressed.ok()) return compressed.status();
  record.bytes = std::move(*compressed);
  return record;
}

absl::Status ApplyDelta(RecordEncoding encoding, const char* payload, size_t payload_bytes,
                        char* dst, size_t n, DType dtype, WorkerPool* pool) {
  const size_t elem = DTypeSize(dtype);
  switch (encoding) {
    case RecordEncoding::kXorPlanes:
      return DecodePlaneBlocks(payload, payload_bytes, DTypeScalarSize(dtype), dst, n, /*xor_into=*/true,
                               pool);
    case RecordEncoding::kXor:
      return ApplyXor(payload, payload_bytes, dst, n);
    case RecordEncoding::kSparse:
    case RecordEncoding::kTopK:
      return ApplySparse(encoding, payload, payload_bytes, dst, n, elem);
    case RecordEncoding::kRaw:
    case RecordEncoding::kZstd:
    case RecordEncoding::kPlanes:
      break;
  }
  return absl::DataLossError(absl::StrCat(RecordEncodingName(encoding), " is not a delta encoding"));
}

}  // namespace ckpt::internal
