// CRC32C (Castagnoli), the checksum S3 checks a part or object against
// (`x-amz-checksum-crc32c`), and the base64 form S3 wants it in.
#ifndef CKPT_OBJECT_CRC32C_H_
#define CKPT_OBJECT_CRC32C_H_

#include <cstdint>
#include <span>
#include <string>

#include "absl/strings/string_view.h"

namespace ckpt::internal {

// CRC32C of `data`, continuing from `crc` (0 to start): the CPU's crc32
// instruction where it has one (x86-64 SSE4.2), else Crc32cPortable.
uint32_t Crc32c(std::span<const char> data, uint32_t crc = 0);
// The same from tables (slicing by 8), on any CPU.
uint32_t Crc32cPortable(std::span<const char> data, uint32_t crc = 0);
// The 4 big-endian bytes of `crc`, base64 (as S3's checksum headers carry it).
std::string Crc32cBase64(uint32_t crc);
std::string Base64(absl::string_view bytes);

}  // namespace ckpt::internal

#endif  // CKPT_OBJECT_CRC32C_H_
