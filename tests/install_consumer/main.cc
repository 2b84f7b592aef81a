// Saves and restores one tensor through the installed ckpt; exits 0 on success.
#include <cstdio>
#include <cstring>
#include <vector>

#include "ckpt/compact.h"
#include "ckpt/engine.h"
#include "ckpt/reader.h"

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  std::vector<float> w = {1.5f, -2.0f, 3.25f};
  ckpt::EngineOptions options;
  auto engine = ckpt::Engine::Open(argv[1], options);
  if (!engine.ok()) return std::puts(engine.status().ToString().c_str()), 1;
  std::vector<ckpt::TensorView> views = {
      {"layer.w", ckpt::DType::kFloat32, {3}, w.data(), w.size() * sizeof(float)}};
  if (!(*engine)->Save(7, views).ok()) return 1;
  auto reader = ckpt::Reader::Open(argv[1], ckpt::ReaderOptions{});
  if (!reader.ok() || (*reader)->step() != 7) return 1;
  std::vector<float> back(3);
  ckpt::ReadTarget target{"layer.w", back.data(), back.size() * sizeof(float)};
  if (!(*reader)->ReadInto({&target, 1}).ok()) return 1;
  if (std::memcmp(back.data(), w.data(), sizeof(float) * 3) != 0) return 1;
  // Compaction is installed too (a full checkpoint has nothing to compact).
  auto compacted = ckpt::CompactToFull(argv[1], 7);
  return compacted.status().code() == absl::StatusCode::kFailedPrecondition ? 0 : 1;
}
