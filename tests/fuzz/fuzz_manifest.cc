// Fuzzes ParseManifest and ParseGlobalManifest (a multi-rank checkpoint's
// MANIFEST.json), the first thing a reader does with a manifest's bytes. Most inputs are given a correct checksum trailer first, so the
// fuzzer explores the JSON and bounds checks behind it, not only the
// checksum; inputs starting with '!' are passed as they are.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "format/global_manifest.h"
#include "format/manifest.h"
#include "util/hash.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  if (!text.empty() && text[0] == '!') {
    (void)ckpt::internal::ParseManifest(absl::string_view(text).substr(1), "fuzz/MANIFEST.json");
    (void)ckpt::internal::ParseGlobalManifest(absl::string_view(text).substr(1), "fuzz/MANIFEST.json");
    return 0;
  }
  const uint64_t hash = ckpt::internal::Xxh3(text.data(), text.size());
  absl::StrAppend(&text, ",\n \"manifest_xxh3\": \"", absl::StrFormat("%016x", hash), "\"\n}\n");
  auto global = ckpt::internal::ParseGlobalManifest(text, "fuzz/MANIFEST.json");
  if (global.ok()) {
    // One part per rank, in order; a delta's parts agree on its base.
    if (global->ranks.size() != static_cast<size_t>(global->world_size)) __builtin_trap();
    for (size_t r = 0; r < global->ranks.size(); ++r) {
      const ckpt::internal::RankPart& p = global->ranks[r];
      if (p.rank != static_cast<int>(r)) __builtin_trap();
      if (p.kind == ckpt::CheckpointKind::kDelta &&
          (global->kind != ckpt::CheckpointKind::kDelta || p.base_step != global->base_step)) {
        __builtin_trap();
      }
    }
  }
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
