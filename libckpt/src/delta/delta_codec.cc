#include "delta/delta_codec.h"

#include <zstd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"

namespace ckpt::internal {
namespace {

constexpr uint8_t kSparseTag = 1;
constexpr uint8_t kXorTag = 2;

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

absl::StatusOr<std::vector<char>> Compress(const std::vector<char>& raw, int level) {
  std::vector<char> out(ZSTD_compressBound(raw.size()));
  const size_t z = ZSTD_compress(out.data(), out.size(), raw.data(), raw.size(), level);
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

}  // namespace

absl::StatusOr<DeltaRecord> EncodeExactDelta(std::span<const Piece> x, char* r, size_t n,
                                             DType dtype, int zstd_level) {
  const size_t elem = DTypeSize(dtype);
  std::vector<uint64_t> indices;
  std::vector<char> values;
  ForEachChanged(x, r, elem, [&](uint64_t i, const char* xe, const char*) {
    indices.push_back(i);
    values.insert(values.end(), xe, xe + elem);
  });
  DeltaRecord record;
  record.changed = indices.size();
  std::vector<char> raw;
  // Sparse costs ~(elem + 1..2) bytes per change; xor costs n bytes before
  // compression (cheap when few bits changed). Past a quarter changed, xor.
  if (indices.size() * 4 <= n / elem) {
    record.encoding = RecordEncoding::kSparse;
    raw = SparsePayload(indices, values.data(), elem);
  } else {
    record.encoding = RecordEncoding::kXor;
    raw.resize(1 + n);
    raw[0] = static_cast<char>(kXorTag);
    size_t offset = 0;
    for (const Piece& p : x) {
      for (size_t i = 0; i < p.bytes; ++i) raw[1 + offset + i] = p.data[i] ^ r[offset + i];
      offset += p.bytes;
    }
  }
  auto compressed = Compress(raw, zstd_level);
  if (!compressed.ok()) return compressed.status();
  record.bytes = std::move(*compressed);
  // R becomes X.
  size_t offset = 0;
  for (const Piece& p : x) {
    std::memcpy(r + offset, p.data, p.bytes);
    offset += p.bytes;
  }
  return record;
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
                        char* dst, size_t n, DType dtype) {
  const size_t elem = DTypeSize(dtype);
  const uint64_t numel = elem == 0 ? 0 : n / elem;
  const unsigned long long content = ZSTD_getFrameContentSize(payload, payload_bytes);
  const uint64_t limit = 1 + 10 + numel * (10 + elem) + n;
  if (content == ZSTD_CONTENTSIZE_ERROR || content == ZSTD_CONTENTSIZE_UNKNOWN || content > limit) {
    return absl::DataLossError(absl::StrCat(RecordEncodingName(encoding), " delta: bad zstd frame header"));
  }
  std::vector<char> raw(content);
  const size_t got = ZSTD_decompress(raw.data(), raw.size(), payload, payload_bytes);
  if (ZSTD_isError(got) || got != content) {
    return absl::DataLossError(absl::StrCat(RecordEncodingName(encoding), " delta: corrupt zstd data"));
  }
  if (raw.empty()) return absl::DataLossError(absl::StrCat(RecordEncodingName(encoding), " delta: empty payload"));
  if (encoding == RecordEncoding::kXor) {
    if (static_cast<uint8_t>(raw[0]) != kXorTag || raw.size() != 1 + n) {
      return absl::DataLossError("xor delta: wrong size");
    }
    for (size_t i = 0; i < n; ++i) dst[i] ^= raw[1 + i];
    return absl::OkStatus();
  }
  if (static_cast<uint8_t>(raw[0]) != kSparseTag) {
    return absl::DataLossError(absl::StrCat(RecordEncodingName(encoding), " delta: bad tag"));
  }
  size_t pos = 1;
  auto varint = [&](uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos >= raw.size()) return false;
      const auto b = static_cast<uint8_t>(raw[pos++]);
      *v |= uint64_t{b & 0x7Fu} << shift;
      if ((b & 0x80) == 0) return true;
    }
    return false;
  };
  uint64_t count;
  if (!varint(&count) || count > numel) return absl::DataLossError("sparse delta: bad count");
  std::vector<uint64_t> indices(count);
  uint64_t next = 0;
  for (uint64_t j = 0; j < count; ++j) {
    uint64_t gap;
    if (!varint(&gap) || gap >= numel - next + 0 || next + gap >= numel) {
      return absl::DataLossError("sparse delta: index out of range");
    }
    indices[j] = next + gap;
    next = indices[j] + 1;
  }
  if (raw.size() - pos != count * elem) return absl::DataLossError("sparse delta: wrong value bytes");
  for (uint64_t j = 0; j < count; ++j) {
    std::memcpy(dst + indices[j] * elem, raw.data() + pos + j * elem, elem);
  }
  return absl::OkStatus();
}

}  // namespace ckpt::internal
