// ckpt/engine.h: writes checkpoints into a root directory.
//
//   ckpt::EngineOptions options;
//   auto engine = ckpt::Engine::Open("/ckpt/run1", options);
//   if (!engine.ok()) return engine.status();
//   std::vector<ckpt::TensorView> tensors = {
//       {"model.fc.weight", ckpt::DType::kFloat32, {4096, 4096}, w, 4096 * 4096 * 4}};
//   auto stats = (*engine)->Save(/*step=*/1200, tensors, R"({"epoch": 3})");
//
// A save is atomic: when `Save` returns OK, `ROOT/step-<step>` is complete,
// fsynced and visible; when it returns an error (or the process dies), no
// part of it is visible and earlier checkpoints are untouched.
#ifndef CKPT_ENGINE_H_
#define CKPT_ENGINE_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "ckpt/options.h"
#include "ckpt/tensor.h"

namespace ckpt {

// What one save did.
struct SaveStats {
  int64_t step = 0;
  std::string dir;              // the committed checkpoint directory
  uint64_t tensor_bytes = 0;    // sum of the tensors' sizes
  uint64_t file_bytes = 0;      // bytes of shard files on disk
  size_t tensor_count = 0;
  size_t shard_count = 0;
  double seconds = 0;           // whole save, commit included
  std::string backend;          // e.g. "io_uring+O_DIRECT"
};

class Engine {
 public:
  // Opens (creating if allowed) the checkpoint root `root`, probes the I/O
  // backend and allocates the engine's I/O buffers once. Errors: ROOT is not
  // a directory, cannot be created, or a forced backend is refused.
  static absl::StatusOr<std::unique_ptr<Engine>> Open(const std::string& root,
                                                      const EngineOptions& options);
  virtual ~Engine() = default;

  // Writes checkpoint `step` holding `tensors` and `extras_json` (a JSON
  // object kept verbatim in the manifest), and commits it atomically.
  // Invalid input (a duplicate, empty, NUL-bearing or non-UTF-8 name, a shape
  // that does not match the byte size, an unknown dtype, a negative step, a
  // step that already exists, extras that are not a JSON object) is
  // kInvalidArgument / kAlreadyExists and writes nothing. I/O errors name the
  // failing path; the partial checkpoint is removed and never becomes visible.
  // Thread-safe: concurrent saves run one after the other.
  virtual absl::StatusOr<SaveStats> Save(int64_t step, std::span<const TensorView> tensors,
                                         absl::string_view extras_json = "{}") = 0;

  virtual const std::string& root() const = 0;
  // The backend chosen at `Open`, e.g. "io_uring+O_DIRECT" or "threads+buffered".
  virtual absl::string_view backend() const = 0;
};

}  // namespace ckpt

#endif  // CKPT_ENGINE_H_
