// Fuzzes SafetensorsHeader (ckpt/safetensors.h), the header that
// `ckpt-restore --out` writes before the tensors' bytes, with tensor lists
// decoded from the input: names of any bytes (invalid UTF-8, NUL,
// "__metadata__", duplicates of an earlier name), any DType value (out of
// range ones included), shapes of any int64 dimensions (negative, huge),
// raw_bytes matching the shape, off by a little or any u64; and any step and
// extras bytes.
//   Input  := i64 step, u16 length + extras bytes, Tensor* (at most 64)
//   Tensor := u8 flags, Name, u8 dtype, u8 rank (% 9), rank * Dim, [Raw]
//     Name: by flags & 3: 0, 3 u8 length + bytes; 1 "__metadata__";
//           2 u8 i: the name of tensor i % count (a duplicate), else bytes
//     Dim:  flags & 4: an i64; else a u8
//     Raw:  by (flags >> 3) & 3: 0, 3 none (the shape's byte count);
//           1 i8 added to it; 2 any u64
// Properties (abort() on violation): it never crashes or throws; it fails
// exactly when the header documents it must (a name that is not valid
// UTF-8, is "__metadata__" or repeats, a dtype without a name, a shape whose
// byte count -- as ckpt::TensorBytes counts it -- is not raw_bytes,
// offsets past 2^64, extras not valid UTF-8);
// on success the result is the 8-byte little-endian length N, then N bytes
// (N % 8 == 0) of JSON that parses into an object whose keys are
// "__metadata__" (format, ckpt_step, ckpt_extras as given) plus exactly the
// tensor names, each with its dtype's safetensors name, its shape and
// data_offsets contiguous from 0 with end - begin == raw_bytes.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "ckpt/dtype.h"
#include "ckpt/reader.h"
#include "ckpt/safetensors.h"
#include "nlohmann/json.hpp"

namespace {

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "fuzz_safetensors: property violated: %s\n", what.c_str());
  std::abort();
}
#define CHECK_OR_FAIL(cond, ...)                               \
  do {                                                         \
    if (!(cond)) Fail(absl::StrCat(#cond, ": ", __VA_ARGS__)); \
  } while (false)

class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool done() const { return pos_ >= size_; }
  uint8_t U8() { return pos_ < size_ ? data_[pos_++] : 0; }
  uint64_t U64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= uint64_t{U8()} << (8 * i);
    return v;
  }
  std::string Bytes(size_t n) {
    n = std::min(n, size_ - pos_);
    std::string s(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return s;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// RFC 3629 UTF-8: no overlong forms, no surrogates, nothing past U+10FFFF.
bool IsUtf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = s[i];
    size_t n;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xe0) == 0xc0) {
      n = 1, cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      n = 2, cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      n = 3, cp = c & 0x07;
    } else {
      return false;
    }
    if (i + n >= s.size()) return false;
    for (size_t k = 1; k <= n; ++k) {
      const unsigned char d = s[i + k];
      if ((d & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3f);
    }
    static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += n + 1;
  }
  return true;
}

const char* SafetensorsName(ckpt::DType dtype) {
  // By enum value; complex128 has no safetensors name.
  static const char* const kNames[] = {"BOOL",    "U8",      "I8",          "I16",        "I32",
                                       "I64",     "U16",     "U32",         "U64",        "F16",
                                       "BF16",    "F32",     "F64",         "C64",        nullptr,
                                       "F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F8_E8M0"};
  static_assert(sizeof(kNames) / sizeof(kNames[0]) == ckpt::kNumDTypes);
  const auto v = static_cast<uint8_t>(dtype);
  return v < ckpt::kNumDTypes ? kNames[v] : nullptr;
}

// The byte count of a tensor as ckpt defines it (ckpt::TensorBytes): the
// element count multiplied out in order must fit 64 bits at every step (a
// later 0 does not make up for an overflow), and so must the bytes; nullopt
// for a negative dimension or an overflow.
std::optional<uint64_t> ByteCount(const ckpt::TensorInfo& t) {
  unsigned __int128 n = 1;
  for (int64_t d : t.shape) {
    if (d < 0) return std::nullopt;
    n *= static_cast<uint64_t>(d);
    if (n > UINT64_MAX) return std::nullopt;
  }
  n *= ckpt::DTypeSize(t.dtype);
  if (n > UINT64_MAX) return std::nullopt;
  return static_cast<uint64_t>(n);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  const int64_t step = static_cast<int64_t>(in.U64());
  const size_t extras_length = in.U8() | (size_t{in.U8()} << 8);
  const std::string extras = in.Bytes(extras_length);
  std::vector<ckpt::TensorInfo> infos;
  while (!in.done() && infos.size() < 64) {
    const uint8_t flags = in.U8();
    ckpt::TensorInfo t;
    switch (flags & 3) {
      case 1: t.name = "__metadata__"; break;
      case 2: {
        const uint8_t i = in.U8();
        t.name = infos.empty() ? in.Bytes(in.U8()) : infos[i % infos.size()].name;
        break;
      }
      default: t.name = in.Bytes(in.U8()); break;
    }
    t.dtype = static_cast<ckpt::DType>(in.U8());
    const int rank = in.U8() % 9;
    for (int d = 0; d < rank; ++d) {
      t.shape.push_back((flags & 4) != 0 ? static_cast<int64_t>(in.U64()) : int64_t{in.U8()});
    }
    const uint64_t bytes = ByteCount(t).value_or(0);
    switch ((flags >> 3) & 3) {
      case 1:
        t.raw_bytes = bytes + static_cast<uint64_t>(static_cast<int64_t>(static_cast<int8_t>(in.U8())));
        break;
      case 2: t.raw_bytes = in.U64(); break;
      default: t.raw_bytes = bytes; break;
    }
    t.stored_bytes = t.raw_bytes;
    infos.push_back(std::move(t));
  }
  std::vector<const ckpt::TensorInfo*> tensors;
  for (const ckpt::TensorInfo& t : infos) tensors.push_back(&t);

  // What the header says must fail.
  std::string must_fail;
  std::set<std::string> names;
  unsigned __int128 total = 0;
  for (const ckpt::TensorInfo& t : infos) {
    const std::optional<uint64_t> bytes = ByteCount(t);
    const std::string what = absl::StrCat("tensor \"", absl::CHexEscape(t.name), "\": ");
    if (!IsUtf8(t.name)) must_fail = what + "not UTF-8";
    if (t.name == "__metadata__") must_fail = what + "reserved";
    if (!names.insert(t.name).second) must_fail = what + "repeated";
    if (SafetensorsName(t.dtype) == nullptr) must_fail = what + "no dtype name";
    if (!bytes.has_value() || *bytes != t.raw_bytes) must_fail = what + "byte count";
    total += t.raw_bytes;
  }
  if (total > UINT64_MAX) must_fail = "offsets past 2^64";
  if (!IsUtf8(extras)) must_fail = "extras not UTF-8";

  absl::StatusOr<std::string> header;
  try {
    header = ckpt::SafetensorsHeader(tensors, step, extras);
  } catch (...) {
    Fail("SafetensorsHeader threw");
  }
  if (std::getenv("CKPT_FUZZ_VERBOSE") != nullptr) {
    std::fprintf(stderr, "fuzz_safetensors: %zu tensors: %s%s%s\n", infos.size(),
                 header.ok() ? "OK" : header.status().ToString().c_str(),
                 must_fail.empty() ? "" : "; expected: ", must_fail.c_str());
  }
  if (!must_fail.empty()) {
    CHECK_OR_FAIL(!header.ok(), "accepted: ", must_fail);
    CHECK_OR_FAIL(absl::IsInvalidArgument(header.status()), header.status().ToString());
    return 0;
  }
  CHECK_OR_FAIL(header.ok(), "refused a valid list of ", infos.size(),
                " tensors: ", header.status().ToString());

  const std::string& out = *header;
  CHECK_OR_FAIL(out.size() >= 8, out.size());
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t{static_cast<uint8_t>(out[i])} << (8 * i);
  CHECK_OR_FAIL(out.size() == 8 + n, out.size(), " bytes, length field ", n);
  CHECK_OR_FAIL(n % 8 == 0, n);
  const nlohmann::json j =
      nlohmann::json::parse(out.begin() + 8, out.end(), nullptr, /*allow_exceptions=*/false);
  CHECK_OR_FAIL(!j.is_discarded() && j.is_object(), "header is not a JSON object");
  CHECK_OR_FAIL(j.size() == infos.size() + 1, j.size(), " keys for ", infos.size(), " tensors");
  auto meta = j.find("__metadata__");
  CHECK_OR_FAIL(meta != j.end() && meta->is_object(), "no __metadata__ object");
  CHECK_OR_FAIL(meta->value("format", "") == "pt", meta->dump());
  CHECK_OR_FAIL(meta->value("ckpt_step", "") == absl::StrCat(step), meta->dump());
  CHECK_OR_FAIL(meta->contains("ckpt_extras") && (*meta)["ckpt_extras"].is_string() &&
                    (*meta)["ckpt_extras"].get<std::string>() == extras,
                "extras do not round-trip");
  uint64_t offset = 0;
  for (const ckpt::TensorInfo& t : infos) {
    const std::string what = absl::StrCat("tensor \"", absl::CHexEscape(t.name), "\"");
    auto e = j.find(t.name);
    CHECK_OR_FAIL(e != j.end() && e->is_object(), what, " missing");
    CHECK_OR_FAIL(e->value("dtype", "") == SafetensorsName(t.dtype), what, " dtype");
    CHECK_OR_FAIL(e->contains("shape") && (*e)["shape"] == nlohmann::json(t.shape), what, " shape");
    const auto offsets = e->find("data_offsets");
    CHECK_OR_FAIL(offsets != e->end() && offsets->is_array() && offsets->size() == 2 &&
                      (*offsets)[0].is_number_unsigned() && (*offsets)[1].is_number_unsigned(),
                  what, " data_offsets");
    const uint64_t begin = (*offsets)[0].get<uint64_t>(), end = (*offsets)[1].get<uint64_t>();
    CHECK_OR_FAIL(begin == offset && end >= begin && end - begin == t.raw_bytes, what, " at [", begin, ", ",
                  end, "), expected [", offset, ", +", t.raw_bytes, ")");
    offset = end;
  }
  return 0;
}
