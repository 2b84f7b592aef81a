#include "format/names.h"

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_format.h"

namespace ckpt::internal {
namespace {

// Length of the UTF-8 sequence starting at `s[i]`, or 0 if it is invalid
// (overlong forms, surrogates and code points above U+10FFFF included).
size_t Utf8SequenceLength(absl::string_view s, size_t i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) return 1;
  size_t len;
  uint32_t cp;
  if ((b0 & 0xE0) == 0xC0) { len = 2; cp = b0 & 0x1F; }
  else if ((b0 & 0xF0) == 0xE0) { len = 3; cp = b0 & 0x0F; }
  else if ((b0 & 0xF8) == 0xF0) { len = 4; cp = b0 & 0x07; }
  else return 0;
  if (i + len > s.size()) return 0;
  for (size_t k = 1; k < len; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b & 0x3F);
  }
  static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return len;
}

}  // namespace

absl::Status ValidateTensorName(absl::string_view name) {
  if (name.empty()) return absl::InvalidArgumentError("tensor name is empty");
  if (name.size() > kMaxTensorNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat("tensor name of ", name.size(),
                                                   " bytes exceeds ", kMaxTensorNameBytes));
  }
  for (size_t i = 0; i < name.size();) {
    if (name[i] == '\0') {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor name \"", absl::CHexEscape(name), "\" contains NUL at byte ", i));
    }
    size_t len = Utf8SequenceLength(name, i);
    if (len == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor name \"", absl::CHexEscape(name), "\" is not valid UTF-8 at byte ", i));
    }
    i += len;
  }
  return absl::OkStatus();
}

absl::string_view ModuleOf(absl::string_view name) {
  size_t pos = name.find_last_of("./");
  return pos == absl::string_view::npos ? absl::string_view() : name.substr(0, pos);
}

std::string SanitizeFileNamePart(absl::string_view text) {
  std::string out;
  out.reserve(std::min<size_t>(text.size(), 64));
  for (char c : text) {
    if (out.size() >= 64) break;
    bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                c == '_' || c == '-' || c == '.';
    if (c == '.' && (out.empty() || out.back() == '.')) keep = false;
    out.push_back(keep ? c : '_');
  }
  if (out.empty()) out = "tensors";
  return out;
}

bool IsSafeFileName(absl::string_view name) {
  if (name.empty() || name.size() > 255 || name.front() == '.') return false;
  return name.find('/') == absl::string_view::npos && name.find('\0') == absl::string_view::npos;
}

std::string CheckpointDirName(int64_t step) { return absl::StrFormat("step-%020d", step); }

std::optional<int64_t> ParseCheckpointDirName(absl::string_view name) {
  constexpr absl::string_view kPrefix = "step-";
  if (name.size() != kPrefix.size() + 20 || name.substr(0, kPrefix.size()) != kPrefix) {
    return std::nullopt;
  }
  int64_t value = 0;
  for (char c : name.substr(kPrefix.size())) {
    if (c < '0' || c > '9') return std::nullopt;
    const int digit = c - '0';
    // Checked before multiplying: 20 digits can exceed even 2^64, and a
    // wrapped value would name another step's directory.
    if (value > (INT64_MAX - digit) / 10) return std::nullopt;
    value = value * 10 + digit;
  }
  return value;
}

std::string UniqueName(absl::string_view prefix, absl::string_view name) {
  thread_local absl::BitGen gen;
  return absl::StrFormat("%s%s-%016x", prefix, name, absl::Uniform<uint64_t>(gen));
}

std::string TempDirName(int64_t step, uint64_t nonce) {
  return absl::StrFormat("%sstep-%020d-%016x", kTempPrefix, step, nonce);
}

namespace {

constexpr absl::string_view kRankPrefix = "rank-";
constexpr absl::string_view kRankManifestSuffix = ".MANIFEST.json";

}  // namespace

std::string RankManifestName(int rank) {
  return absl::StrFormat("%s%05d%s", kRankPrefix, rank, kRankManifestSuffix);
}

std::string RankFilePrefix(int rank) { return absl::StrFormat("%s%05d.", kRankPrefix, rank); }

std::string MultiRankTempDirName(int64_t step, absl::string_view nonce, int attempt) {
  return absl::StrFormat("%sstep-%020d-%s-%d", kTempPrefix, step, nonce, attempt);
}

}  // namespace ckpt::internal
