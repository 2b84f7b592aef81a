// ckpt/hf_export.h: one checkpoint step as a Hugging Face model directory —
// what `from_pretrained` and the `safetensors` library read (what
// `ckpt-restore --export-hf` writes).
#ifndef CKPT_HF_EXPORT_H_
#define CKPT_HF_EXPORT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ckpt/dtype.h"
#include "ckpt/file_system.h"
#include "ckpt/reader.h"

namespace ckpt {

// transformers 5's default `max_shard_size` ("50GB": decimal gigabytes).
inline constexpr uint64_t kHfDefaultMaxShardBytes = uint64_t{50} * 1000 * 1000 * 1000;

struct HfExportOptions {
  // Only tensors whose names start with `filter` are written.
  std::string filter;
  // Written without this prefix ("model." of a state saved as {"model":
  // model}); tensors whose names lack it are left out, like `filter`'s.
  std::string strip_prefix;
  // A shard file holds tensors in checkpoint order until the next would take
  // it past this many bytes of tensor data (a larger tensor has a file of
  // its own), as transformers' `save_pretrained` shards.
  uint64_t max_shard_bytes = kHfDefaultMaxShardBytes;
  // Floating tensors (fp16, bf16, fp32, fp64) written as this dtype, rounded
  // as PyTorch's `Tensor.to` rounds; others as they are. Unset: as saved.
  std::optional<DType> dtype;
  // Files copied into the directory under their base names (config.json,
  // tokenizer files, ...).
  std::vector<std::string> copy_files;
};

struct HfExportResult {
  size_t tensors = 0;
  size_t shards = 0;        // safetensors files written
  uint64_t tensor_bytes = 0;  // as written (after any dtype conversion)
};

// `ParseShardSize` reads a size as transformers' `max_shard_size` takes it:
// a number of bytes, or one with a unit: KB, MB, GB, TB (powers of 1000)
// or KiB, MiB, GiB, TiB (powers of 1024), case-insensitive ("5GB",
// "500MiB"). kInvalidArgument naming the text otherwise, or for 0.
absl::StatusOr<uint64_t> ParseShardSize(absl::string_view text);

// Writes the selected tensors of `reader` (deltas resolved, every checksum
// verified) into a new directory `dir` as transformers writes a model: one
// `model.safetensors`, or, when they take more than one shard,
// `model-00001-of-0000N.safetensors` ... and `model.safetensors.index.json`
// ({"metadata": {"total_size": bytes, "total_parameters": elements},
// "weight_map": {name: file}}); each file's metadata is {"format": "pt"}.
// Tied weights saved through the Python package are one tensor in the
// checkpoint (the tie is in the state tree), so each is written once, under
// the name met first — the input embedding's, as transformers keeps it —
// and `from_pretrained` ties the other to it. Everything is written into a
// temporary directory beside `dir`, fsynced, renamed to `dir` and its parent
// fsynced: `dir` appears complete or not at all, and nothing is left behind
// on failure. kAlreadyExists if `dir` exists; kInvalidArgument for an empty
// selection, two tensors that come to one name, a name that is empty or
// "__metadata__", a dtype that is not floating, `max_shard_bytes` 0, or a
// `copy_files` entry that cannot be read or whose name is taken; file-system
// errors of the export itself keep their codes. `progress` is called with (0, total) and then
// (done, total) after each tensor, in tensor bytes as written.
absl::StatusOr<HfExportResult> ExportHuggingFace(
    Reader& reader, const std::string& dir, const HfExportOptions& options,
    const std::function<void(uint64_t done, uint64_t total)>& progress = {},
    std::shared_ptr<FileSystem> fs = nullptr);

}  // namespace ckpt

#endif  // CKPT_HF_EXPORT_H_
