// Fuzzes ParseManifest, the first thing a reader does with a manifest's
// bytes. Most inputs are given a correct checksum trailer first, so the
// fuzzer explores the JSON and bounds checks behind it, not only the
// checksum; inputs starting with '!' are passed as they are.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "format/manifest.h"
#include "util/hash.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  if (!text.empty() && text[0] == '!') {
    (void)ckpt::internal::ParseManifest(absl::string_view(text).substr(1), "fuzz/MANIFEST.json");
    return 0;
  }
  const uint64_t hash = ckpt::internal::Xxh3(text.data(), text.size());
  absl::StrAppend(&text, ",\n \"manifest_xxh3\": \"", absl::StrFormat("%016x", hash), "\"\n}\n");
  auto manifest = ckpt::internal::ParseManifest(text, "fuzz/MANIFEST.json");
  if (manifest.ok()) {
    // What a reader relies on once a manifest parsed: every record inside
    // its shard, sizes consistent.
    for (const ckpt::TensorInfo& t : manifest->tensors) {
      bool found = false;
      for (const ckpt::internal::ShardInfo& s : manifest->shards) {
        if (s.file != t.shard) continue;
        found = true;
        if (t.offset > s.bytes || t.stored_bytes > s.bytes - t.offset) __builtin_trap();
      }
      if (!found) __builtin_trap();
    }
  }
  return 0;
}
