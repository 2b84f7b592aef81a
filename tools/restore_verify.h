// tools/restore_verify.h: verifying one checkpoint tensor by tensor, so that
// ckpt-restore can show how far it got.
#ifndef CKPT_TOOLS_RESTORE_VERIFY_H_
#define CKPT_TOOLS_RESTORE_VERIFY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckpt/reader.h"
#include "progress_bar.h"

namespace ckpt::tools {

struct VerifyOptions {
  // With a progress report, tensors are read in batches of about this many
  // bytes (one `Reader::ReadInto` each, many transfers in flight).
  uint64_t batch_bytes = uint64_t{64} << 20;
  // A checkpoint whose largest tensor is bigger than this is checked by
  // `Reader::Verify` in one call instead, so that verifying never holds a
  // huge tensor in memory; progress then advances once, at the end.
  uint64_t max_tensor_bytes = uint64_t{1} << 30;
};

// `VerifyTensors` reads every tensor of `reader` and checks every checksum:
// a delta is rebuilt through its chain, checking every link's records it
// uses (the chain's manifests were checked when `reader` was opened).
// Without `progress` this is `Reader::Verify`, the fastest path. With it, the
// tensors are read in batches through `Reader::ReadInto` (the same checks)
// and after each batch `progress(n)` is told that `n` more bytes of tensors
// (raw bytes, as restored) are done; when all is well they add up to the sum
// of `raw_bytes` over `reader.tensors()`. Returns the first failure,
// kDataLoss naming the shard file and the tensor for damage.
absl::Status VerifyTensors(Reader& reader, const std::function<void(uint64_t)>& progress,
                           const VerifyOptions& options = {});

// `OpenStep` opens checkpoint `step` of `root`: its manifest and, for a
// delta, every base's manifest down to a full checkpoint are checked (a
// missing or replaced base is kDataLoss naming it); no tensor data is read.
absl::StatusOr<std::unique_ptr<Reader>> OpenStep(const std::string& root, int64_t step);

// `VerifyStep` opens checkpoint `step` and verifies it (`VerifyTensors`),
// counting the tensor bytes on `bar` when it is drawn (and taking the
// faster, uncounted path when it is not). Whatever happens, the bar advances by
// exactly `budget` bytes (the checkpoint's tensor bytes, from
// `TensorBytesByStep`): a failure counts the bytes it left unread as done, so
// that a run over many checkpoints ends at 100%.
absl::StatusOr<std::unique_ptr<Reader>> VerifyStep(const std::string& root, int64_t step,
                                                   ProgressBar& bar, uint64_t budget);

// `TensorBytesByStep` is the tensor bytes of every committed checkpoint of
// `root` whose manifest reads, from the manifests: the totals a progress bar
// needs before it starts. Empty when `bar` is disabled (nothing is read) or
// the root cannot be listed.
std::map<int64_t, uint64_t> TensorBytesByStep(const std::string& root, const ProgressBar& bar);

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_RESTORE_VERIFY_H_
