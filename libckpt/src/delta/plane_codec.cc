// Over ~400 lines on purpose: the block format, its encoder and its
// hostile-input decoder share the private format constants and the
// per-element-size split/merge kernels; apart, the format's internals would
// need a header of their own for no other user.
//
// Block format (docs/format.md, "planes"). A payload is a sequence of blocks;
// block b holds the next `count` elements of the record (E = element size in
// bytes, 1, 2, 4 or 8). Integers are little-endian.
//
//   offset  size  field
//   0       1     magic 0xB1 (format version 1 of the block)
//   1       1     kind: 0 = raw, 1 = planes
//   2       1     E, the element size; must equal the record dtype's size
//   3       4     count, elements in the block (u32; 1 <= count * E <= 2^20)
//   kind raw:    count * E bytes, the block's bytes as they are.
//   kind planes: E plane descriptors, plane 0 (every element's byte 0, the
//                least significant) first, each
//                  1 byte  mode: 0 = zstd, 1 = verbatim, 2 = constant
//                  4 bytes stored length L (u32)
//                then the E planes' stored bytes, in plane order:
//                  zstd:      L bytes, zstd frame(s) decompressing to exactly
//                             `count` bytes (L < count)
//                  verbatim:  L == count bytes, the plane itself
//                  constant:  L == 1 byte, repeated `count` times (an
//                             all-zero plane, common in XOR deltas, is a
//                             constant 0)
// The blocks of a payload must cover the record exactly (sum of count * E ==
// the record's bytes) and the payload must end with the last block. Encoders
// cut records into blocks of kPlaneBlockBytes (the last one shorter), but a
// decoder accepts any cut into blocks of at most kPlaneBlockBytes.
//
// Decoding is bound-checked against hostile input: every length is checked
// against what is left of the payload and of the destination before use,
// and decoded bytes go to per-thread scratch of at most kPlaneBlockBytes
// (grown once), never to an allocation sized by the payload.
#include "delta/plane_codec.h"

// For ZSTD_c_literalCompressionMode (stable in the library since 1.5.0).
#define ZSTD_STATIC_LINKING_ONLY
#include <zstd.h>
#include <zstd_errors.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "codec/zstd_context.h"
#include "util/status_macros.h"

namespace ckpt::internal {
namespace {

constexpr uint8_t kMagic = 0xB1;
constexpr uint8_t kKindRaw = 0;
constexpr uint8_t kKindPlanes = 1;
constexpr uint8_t kModeZstd = 0;
constexpr uint8_t kModeVerbatim = 1;
constexpr uint8_t kModeConstant = 2;
constexpr size_t kHeaderBytes = 7;
constexpr size_t kPlaneDescriptorBytes = 5;
constexpr size_t kMaxElem = 8;
static_assert(kMinPlaneBlockBytes == kHeaderBytes + kPlaneDescriptorBytes + 1);

void PutU32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<uint8_t>(p[i])} << (8 * i);
  return v;
}

bool ValidElem(size_t elem) { return elem == 1 || elem == 2 || elem == 4 || elem == 8; }

// Per-thread scratch of `kPlaneBlockBytes`, allocated once per thread
// (uninitialized: nothing is read before it is written).
char* Scratch() {
  thread_local std::unique_ptr<char[]> scratch(new char[kPlaneBlockBytes]);
  return scratch.get();
}

// Split: plane k of `count` elements at out + k * count gets byte k of each
// element of src (xor'ed with `r`'s when kXor). Loads whole elements and
// shifts, one named pointer per plane: GCC vectorizes this at -O2 (an
// array of plane pointers and an inner loop over k it does not).
template <typename U, bool kXor>
inline U Load(const char* __restrict src, const char* __restrict r, size_t i) {
  U v;
  std::memcpy(&v, src + i * sizeof(U), sizeof(U));
  if constexpr (kXor) {
    U w;
    std::memcpy(&w, r + i * sizeof(U), sizeof(U));
    v ^= w;
  }
  return v;
}

template <bool kXor>
void Split1(const char* __restrict src, const char* __restrict r, size_t count,
            uint8_t* __restrict out) {
  for (size_t i = 0; i < count; ++i) out[i] = Load<uint8_t, kXor>(src, r, i);
}

template <bool kXor>
void Split2(const char* __restrict src, const char* __restrict r, size_t count,
            uint8_t* __restrict out) {
  uint8_t* __restrict p0 = out;
  uint8_t* __restrict p1 = out + count;
  for (size_t i = 0; i < count; ++i) {
    const uint16_t v = Load<uint16_t, kXor>(src, r, i);
    p0[i] = static_cast<uint8_t>(v);
    p1[i] = static_cast<uint8_t>(v >> 8);
  }
}

template <bool kXor>
void Split4(const char* __restrict src, const char* __restrict r, size_t count,
            uint8_t* __restrict out) {
  uint8_t* __restrict p0 = out;
  uint8_t* __restrict p1 = out + count;
  uint8_t* __restrict p2 = out + 2 * count;
  uint8_t* __restrict p3 = out + 3 * count;
  for (size_t i = 0; i < count; ++i) {
    const uint32_t v = Load<uint32_t, kXor>(src, r, i);
    p0[i] = static_cast<uint8_t>(v);
    p1[i] = static_cast<uint8_t>(v >> 8);
    p2[i] = static_cast<uint8_t>(v >> 16);
    p3[i] = static_cast<uint8_t>(v >> 24);
  }
}

// Eight planes: as two four-byte halves (GCC does not vectorize eight
// streams of stores at -O2).
template <bool kXor>
void Split8(const char* __restrict src, const char* __restrict r, size_t count,
            uint8_t* __restrict out) {
  for (int half = 0; half < 2; ++half) {
    uint8_t* __restrict p0 = out + (4 * half) * count;
    uint8_t* __restrict p1 = out + (4 * half + 1) * count;
    uint8_t* __restrict p2 = out + (4 * half + 2) * count;
    uint8_t* __restrict p3 = out + (4 * half + 3) * count;
    const int shift = 32 * half;
    for (size_t i = 0; i < count; ++i) {
      const uint32_t v = static_cast<uint32_t>(Load<uint64_t, kXor>(src, r, i) >> shift);
      p0[i] = static_cast<uint8_t>(v);
      p1[i] = static_cast<uint8_t>(v >> 8);
      p2[i] = static_cast<uint8_t>(v >> 16);
      p3[i] = static_cast<uint8_t>(v >> 24);
    }
  }
}

// Merge: the inverse of Split; dst gets (or, with kXor, is xor'ed with) the
// element whose byte k is planes[k][i].
template <typename U, bool kXor>
inline void Store(char* __restrict dst, size_t i, U v) {
  if constexpr (kXor) {
    U w;
    std::memcpy(&w, dst + i * sizeof(U), sizeof(U));
    v ^= w;
  }
  std::memcpy(dst + i * sizeof(U), &v, sizeof(U));
}

template <bool kXor>
void Merge1(const uint8_t* const* planes, size_t count, char* __restrict dst) {
  const uint8_t* __restrict p0 = planes[0];
  for (size_t i = 0; i < count; ++i) Store<uint8_t, kXor>(dst, i, p0[i]);
}

template <bool kXor>
void Merge2(const uint8_t* const* planes, size_t count, char* __restrict dst) {
  const uint8_t* __restrict p0 = planes[0];
  const uint8_t* __restrict p1 = planes[1];
  for (size_t i = 0; i < count; ++i) {
    Store<uint16_t, kXor>(dst, i, static_cast<uint16_t>(p0[i] | p1[i] << 8));
  }
}

template <bool kXor>
void Merge4(const uint8_t* const* planes, size_t count, char* __restrict dst) {
  const uint8_t* __restrict p0 = planes[0];
  const uint8_t* __restrict p1 = planes[1];
  const uint8_t* __restrict p2 = planes[2];
  const uint8_t* __restrict p3 = planes[3];
  for (size_t i = 0; i < count; ++i) {
    Store<uint32_t, kXor>(dst, i, uint32_t{p0[i]} | uint32_t{p1[i]} << 8 |
                                      uint32_t{p2[i]} << 16 | uint32_t{p3[i]} << 24);
  }
}

template <bool kXor>
void Merge8(const uint8_t* const* planes, size_t count, char* __restrict dst) {
  const uint8_t* __restrict p0 = planes[0];
  const uint8_t* __restrict p1 = planes[1];
  const uint8_t* __restrict p2 = planes[2];
  const uint8_t* __restrict p3 = planes[3];
  const uint8_t* __restrict p4 = planes[4];
  const uint8_t* __restrict p5 = planes[5];
  const uint8_t* __restrict p6 = planes[6];
  const uint8_t* __restrict p7 = planes[7];
  for (size_t i = 0; i < count; ++i) {
    const uint64_t lo = uint32_t{p0[i]} | uint32_t{p1[i]} << 8 | uint32_t{p2[i]} << 16 |
                        uint32_t{p3[i]} << 24;
    const uint64_t hi = uint32_t{p4[i]} | uint32_t{p5[i]} << 8 | uint32_t{p6[i]} << 16 |
                        uint32_t{p7[i]} << 24;
    Store<uint64_t, kXor>(dst, i, lo | hi << 32);
  }
}

template <bool kXor>
void Split(const char* src, const char* r, size_t count, size_t elem, uint8_t* out) {
  switch (elem) {
    case 1: Split1<kXor>(src, r, count, out); break;
    case 2: Split2<kXor>(src, r, count, out); break;
    case 4: Split4<kXor>(src, r, count, out); break;
    default: Split8<kXor>(src, r, count, out); break;
  }
}

template <bool kXor>
void Merge(const uint8_t* const* planes, size_t count, size_t elem, char* dst) {
  switch (elem) {
    case 1: Merge1<kXor>(planes, count, dst); break;
    case 2: Merge2<kXor>(planes, count, dst); break;
    case 4: Merge4<kXor>(planes, count, dst); break;
    default: Merge8<kXor>(planes, count, dst); break;
  }
}

void XorInto(char* __restrict dst, const char* __restrict src, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t a, b;
    std::memcpy(&a, dst + i, 8);
    std::memcpy(&b, src + i, 8);
    a ^= b;
    std::memcpy(dst + i, &a, 8);
  }
  for (; i < n; ++i) dst[i] ^= src[i];
}

// True when every byte of p[0, n) equals p[0] (n >= 1).
bool IsConstant(const uint8_t* p, size_t n) {
  const uint8_t c = p[0];
  size_t i = 0;
  // Word-at-a-time, bailing out at the first word that differs.
  const uint64_t pattern = 0x0101010101010101ull * c;
  for (; i + 32 <= n; i += 32) {
    uint64_t w[4];
    std::memcpy(w, p + i, 32);
    if (((w[0] ^ pattern) | (w[1] ^ pattern) | (w[2] ^ pattern) | (w[3] ^ pattern)) != 0) {
      return false;
    }
  }
  for (; i < n; ++i) {
    if (p[i] != c) return false;
  }
  return true;
}

// A plane whose first kSampleBytes zstd shrinks by less than 1/kSampleGain
// is stored verbatim without compressing the rest: the low mantissa planes
// of trained floats (and of their XOR deltas) are noise, and zstd spends as
// long failing on a plane as it does compressing one. `scratch` has room
// for kSampleBytes.
constexpr size_t kSampleBytes = size_t{16} << 10;
constexpr size_t kSampleGain = 50;
bool SampleIsIncompressible(ZSTD_CCtx* cctx, const uint8_t* plane, size_t count, char* scratch) {
  if (count < 4 * kSampleBytes) return false;  // small planes: just try
  const size_t room = kSampleBytes - kSampleBytes / kSampleGain;
  return ZSTD_isError(ZSTD_compress2(cctx, scratch, room, plane, kSampleBytes));
}

// This thread's context, set for planes at `level`. A plane is a stream of
// low-entropy bytes with few long repeats: at fast levels, matches of at
// least 7 bytes and a 4K-entry hash table (measured on trained fp32 weights
// and their deltas: ~5 % smaller and ~20 % faster than level 1's defaults),
// and Huffman-coded literals even at negative levels (which would otherwise
// store literals raw: a high plane 0.41 instead of 0.60 of its size at -5).
ZSTD_CCtx* PlaneCCtx(int level) {
  ZSTD_CCtx* cctx = ThreadZstdCCtx();
  ZSTD_CCtx_reset(cctx, ZSTD_reset_session_and_parameters);
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, level);
  if (level <= 2) {
    ZSTD_CCtx_setParameter(cctx, ZSTD_c_minMatch, 7);
    ZSTD_CCtx_setParameter(cctx, ZSTD_c_hashLog, 12);
    ZSTD_CCtx_setParameter(cctx, ZSTD_c_literalCompressionMode, ZSTD_ps_enable);
  }
  return cctx;
}

void AppendRawBlock(const char* data, const char* xor_with, size_t n, size_t elem,
                    std::vector<char>* out) {
  const size_t at = out->size();
  out->resize(at + kHeaderBytes + n);
  char* h = out->data() + at;
  h[0] = static_cast<char>(kMagic);
  h[1] = static_cast<char>(kKindRaw);
  h[2] = static_cast<char>(elem);
  PutU32(h + 3, static_cast<uint32_t>(n / elem));
  char* body = h + kHeaderBytes;
  if (xor_with == nullptr) {
    std::memcpy(body, data, n);
  } else {
    for (size_t i = 0; i < n; ++i) body[i] = data[i] ^ xor_with[i];
  }
}

// A block's header, parsed and checked.
struct BlockView {
  uint8_t kind = kKindRaw;
  size_t count = 0;                    // elements
  const char* body = nullptr;          // raw bytes, or the first plane's
  std::array<uint8_t, kMaxElem> mode{};
  std::array<uint32_t, kMaxElem> length{};
  size_t total = 0;  // header + body bytes
};

absl::Status BlockError(size_t offset, absl::string_view what) {
  return absl::DataLossError(absl::StrCat("planes block at payload offset ", offset, ": ", what));
}

// Parses the block at p[0, avail) for a record of `elem`-byte elements with
// `room` bytes of the destination left.
absl::Status ParseBlock(const char* p, size_t avail, size_t at, size_t elem, size_t room,
                        BlockView* b) {
  if (avail < kHeaderBytes) return BlockError(at, "truncated header");
  if (static_cast<uint8_t>(p[0]) != kMagic) return BlockError(at, "bad magic");
  b->kind = static_cast<uint8_t>(p[1]);
  if (b->kind != kKindRaw && b->kind != kKindPlanes) return BlockError(at, "unknown kind");
  if (static_cast<uint8_t>(p[2]) != elem) {
    return BlockError(at, absl::StrCat("element size ", static_cast<uint8_t>(p[2]),
                                       " where the dtype has ", elem));
  }
  b->count = GetU32(p + 3);
  const uint64_t bytes = uint64_t{b->count} * elem;
  if (b->count == 0) return BlockError(at, "empty block");
  if (bytes > kPlaneBlockBytes) return BlockError(at, "block larger than the limit");
  if (bytes > room) return BlockError(at, "blocks cover more bytes than the record has");
  size_t pos = kHeaderBytes;
  if (b->kind == kKindRaw) {
    if (avail - pos < bytes) return BlockError(at, "truncated raw block");
    b->body = p + pos;
    b->total = pos + bytes;
    return absl::OkStatus();
  }
  if (avail - pos < elem * kPlaneDescriptorBytes) return BlockError(at, "truncated plane table");
  uint64_t body = 0;
  for (size_t k = 0; k < elem; ++k) {
    b->mode[k] = static_cast<uint8_t>(p[pos]);
    b->length[k] = GetU32(p + pos + 1);
    pos += kPlaneDescriptorBytes;
    const uint32_t len = b->length[k];
    switch (b->mode[k]) {
      case kModeZstd:
        if (len == 0 || len >= b->count) return BlockError(at, "bad zstd plane length");
        break;
      case kModeVerbatim:
        if (len != b->count) return BlockError(at, "verbatim plane of the wrong length");
        break;
      case kModeConstant:
        if (len != 1) return BlockError(at, "constant plane of the wrong length");
        break;
      default:
        return BlockError(at, "unknown plane mode");
    }
    body += len;
  }
  if (avail - pos < body) return BlockError(at, "truncated planes");
  b->body = p + pos;
  b->total = pos + body;
  return absl::OkStatus();
}

// Decodes one parsed block into dst[0, count * elem).
absl::Status DecodeBlock(const BlockView& b, size_t at, size_t elem, char* dst, bool xor_into) {
  const size_t bytes = b.count * elem;
  if (b.kind == kKindRaw) {
    if (xor_into) XorInto(dst, b.body, bytes);
    else std::memcpy(dst, b.body, bytes);
    return absl::OkStatus();
  }
  uint8_t* scratch = reinterpret_cast<uint8_t*>(Scratch());
  const uint8_t* planes[kMaxElem];
  const char* src = b.body;
  for (size_t k = 0; k < elem; ++k) {
    uint8_t* plane = scratch + k * b.count;
    switch (b.mode[k]) {
      case kModeVerbatim:
        planes[k] = reinterpret_cast<const uint8_t*>(src);
        break;
      case kModeConstant:
        std::memset(plane, static_cast<uint8_t>(src[0]), b.count);
        planes[k] = plane;
        break;
      default: {
        const size_t got = ZSTD_decompressDCtx(ThreadZstdDCtx(), plane, b.count, src, b.length[k]);
        if (ZSTD_isError(got) || got != b.count) {
          return BlockError(at, absl::StrCat("plane ", k, ": corrupt zstd data"));
        }
        planes[k] = plane;
      }
    }
    src += b.length[k];
  }
  if (xor_into) Merge<true>(planes, b.count, elem, dst);
  else Merge<false>(planes, b.count, elem, dst);
  return absl::OkStatus();
}

}  // namespace

size_t PlaneBlockBound(size_t n, size_t elem_bytes) {
  return kHeaderBytes + kPlaneDescriptorBytes * elem_bytes + n;
}

absl::Status AppendPlaneBlock(const char* data, size_t n, size_t elem_bytes, int level,
                              bool store_raw, std::vector<char>* out, const char* xor_with) {
  if (!ValidElem(elem_bytes) || n % elem_bytes != 0 || n > kPlaneBlockBytes) {
    return absl::InvalidArgumentError(absl::StrCat("planes block of ", n, " bytes, element size ",
                                                   elem_bytes));
  }
  if (n == 0) return absl::OkStatus();
  if (store_raw) {
    AppendRawBlock(data, xor_with, n, elem_bytes, out);
    return absl::OkStatus();
  }
  const size_t count = n / elem_bytes;
  uint8_t* planes = reinterpret_cast<uint8_t*>(Scratch());
  if (xor_with == nullptr) Split<false>(data, nullptr, count, elem_bytes, planes);
  else Split<true>(data, xor_with, count, elem_bytes, planes);

  const size_t at = out->size();
  out->resize(at + PlaneBlockBound(n, elem_bytes));
  char* h = out->data() + at;
  h[0] = static_cast<char>(kMagic);
  h[1] = static_cast<char>(kKindPlanes);
  h[2] = static_cast<char>(elem_bytes);
  PutU32(h + 3, static_cast<uint32_t>(count));
  char* table = h + kHeaderBytes;
  char* body = table + kPlaneDescriptorBytes * elem_bytes;
  char* w = body;
  bool all_verbatim = true;
  ZSTD_CCtx* cctx = PlaneCCtx(level);
  for (size_t k = 0; k < elem_bytes; ++k) {
    const uint8_t* plane = planes + k * count;
    uint8_t mode;
    size_t len;
    if (IsConstant(plane, count)) {
      mode = kModeConstant;
      len = 1;
      w[0] = static_cast<char>(plane[0]);
    } else {
      // Room for less than the plane: a frame that does not shrink it fails
      // with dstSize_tooSmall, and the plane is stored verbatim.
      mode = kModeVerbatim;
      len = count;
      if (count > 1 && !SampleIsIncompressible(cctx, plane, count, w)) {
        // (A plane must shrink by a sixteenth to be worth decoding with zstd.)
        const size_t z = ZSTD_compress2(cctx, w, count - count / 16 - 1, plane, count);
        if (!ZSTD_isError(z)) {
          mode = kModeZstd;
          len = z;
        } else if (ZSTD_getErrorCode(z) != ZSTD_error_dstSize_tooSmall) {
          out->resize(at);
          return absl::InternalError(absl::StrCat("zstd: ", ZSTD_getErrorName(z)));
        }
      }
      if (mode == kModeVerbatim) std::memcpy(w, plane, count);
    }
    all_verbatim &= mode == kModeVerbatim;
    table[kPlaneDescriptorBytes * k] = static_cast<char>(mode);
    PutU32(table + kPlaneDescriptorBytes * k + 1, static_cast<uint32_t>(len));
    w += len;
  }
  if (all_verbatim) {
    // Nothing gained: a raw block is smaller by its table and decodes faster.
    out->resize(at);
    AppendRawBlock(data, xor_with, n, elem_bytes, out);
    return absl::OkStatus();
  }
  out->resize(static_cast<size_t>(w - out->data()));
  return absl::OkStatus();
}

absl::Status DecodePlaneBlocks(const char* payload, size_t bytes, size_t elem_bytes, char* dst,
                               size_t n, bool xor_into, WorkerPool* pool) {
  if (!ValidElem(elem_bytes)) {
    return absl::DataLossError(absl::StrCat("planes payload for element size ", elem_bytes));
  }
  // Parse every header first (sequentially: each block's size locates the
  // next), so that nothing is written for a payload that does not cover
  // the record exactly.
  struct Located {
    BlockView view;
    size_t at = 0;   // offset in the payload
    size_t dst = 0;  // offset in dst
  };
  thread_local std::vector<Located> blocks;
  blocks.clear();
  size_t pos = 0, covered = 0;
  while (pos < bytes) {
    Located l;
    l.at = pos;
    l.dst = covered;
    CKPT_RETURN_IF_ERROR(ParseBlock(payload + pos, bytes - pos, pos, elem_bytes, n - covered,
                                          &l.view));
    pos += l.view.total;
    covered += l.view.count * elem_bytes;
    blocks.push_back(l);
  }
  if (covered != n) {
    return absl::DataLossError(absl::StrCat("planes payload covers ", covered, " of ", n, " bytes"));
  }
  auto decode = [&](size_t i, std::vector<Located>& list) {
    const Located& l = list[i];
    return DecodeBlock(l.view, l.at, elem_bytes, dst + l.dst, xor_into);
  };
  if (pool == nullptr || pool->threads() == 1 || blocks.size() == 1) {
    for (size_t i = 0; i < blocks.size(); ++i) {
      absl::Status s = decode(i, blocks);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }
  // The list is this thread's; the workers read it through a reference.
  std::vector<Located>& list = blocks;
  std::vector<absl::Status> status(list.size());
  pool->ParallelFor(list.size(), [&](size_t i) { status[i] = decode(i, list); });
  for (absl::Status& s : status) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace ckpt::internal
