// XXH3-64, the checksum of every tensor and manifest.
#ifndef CKPT_UTIL_HASH_H_
#define CKPT_UTIL_HASH_H_

#include <xxhash.h>
#if defined(__x86_64__) || defined(_M_X64)
// Runtime dispatch to the widest vector unit (AVX2/AVX-512): ~2x the SSE2
// baseline, which makes hashing nearly free next to the copy.
#include <xxh_x86dispatch.h>
#endif

#include <cstddef>
#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace ckpt::internal {

inline uint64_t Xxh3(const void* data, size_t size) { return XXH3_64bits(data, size); }

// Incremental XXH3-64 over bytes fed in pieces; equal to `Xxh3` of the
// concatenation.
class Xxh3Stream {
 public:
  Xxh3Stream() : state_(XXH3_createState()) { XXH3_64bits_reset(state_); }
  ~Xxh3Stream() { XXH3_freeState(state_); }
  Xxh3Stream(const Xxh3Stream&) = delete;
  Xxh3Stream& operator=(const Xxh3Stream&) = delete;
  void Reset() { XXH3_64bits_reset(state_); }
  void Update(const void* data, size_t size) { XXH3_64bits_update(state_, data, size); }
  uint64_t Digest() const { return XXH3_64bits_digest(state_); }

 private:
  XXH3_state_t* state_;
};

// 16 lowercase hex digits.
std::string HashToHex(uint64_t hash);
absl::StatusOr<uint64_t> HashFromHex(absl::string_view hex);

}  // namespace ckpt::internal

#endif  // CKPT_UTIL_HASH_H_
