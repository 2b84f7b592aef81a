// ckpt/newest.h: the one rule for "the newest checkpoint that reads back".
//
// Recovery wants the newest checkpoint that is intact, not merely the newest:
// a crash, a bad disk or a truncated copy can leave the newest one damaged.
// Everything that chooses a checkpoint that way (ckpt.load, ckpt-restore
// --latest, the torch ops) walks the committed checkpoints newest first,
// tries each, and falls back to an older one with a record of why it skipped
// the newer ones. `NewestFirst` is that walk; `OpenNewest` runs it with a
// test the caller gives (read the tensors, verify every record, ...).
//
//   std::vector<ckpt::SkippedCheckpoint> skipped;
//   auto reader = ckpt::OpenNewest(root, {}, [](ckpt::Reader& r) { return r.Verify(); },
//                                  [&](const ckpt::SkippedCheckpoint& s) { warn(s); });
#ifndef CKPT_NEWEST_H_
#define CKPT_NEWEST_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckpt/options.h"
#include "ckpt/reader.h"

namespace ckpt {

// A checkpoint the walk passed over, and why.
struct SkippedCheckpoint {
  int64_t step = 0;
  absl::Status why;
};

// `NewestFirst` hands out the committed steps of a root, newest first, to a
// caller that tries each and reports the ones that did not read back.
//
//   NewestFirst walk = *NewestFirst::Start(root);
//   while (std::optional<int64_t> step = walk.Next()) {
//     absl::Status s = TryToLoad(*step);
//     if (s.ok()) return *step;
//     walk.Skip(*step, s);
//   }
//   return walk.NoneLeft();
class NewestFirst {
 public:
  // Lists the committed checkpoints of `root` (`fs` null: `PosixFileSystem()`).
  static absl::StatusOr<NewestFirst> Start(const std::string& root,
                                           std::shared_ptr<FileSystem> fs = nullptr);
  // A walk over `steps` (any order), for callers that listed them.
  explicit NewestFirst(std::vector<int64_t> steps);

  // The next step to try, or nullopt once every step was handed out.
  std::optional<int64_t> Next();
  // Records that `step` did not read back, for `why`.
  void Skip(int64_t step, absl::Status why);

  // The steps skipped so far, newest first.
  const std::vector<SkippedCheckpoint>& skipped() const { return skipped_; }
  // `skipped()` as "step N: <status>" lines.
  std::vector<std::string> SkippedLines() const;
  // The error to report when the walk found nothing: kNotFound, saying "no
  // committed checkpoint" when there was none, else "no checkpoint reads
  // back intact (step N: <why>; ...)". Callers add the root as context.
  absl::Status NoneLeft() const;

 private:
  std::vector<int64_t> steps_;  // ascending; handed out from the back
  size_t tried_ = 0;
  std::vector<SkippedCheckpoint> skipped_;
};

// What `OpenNewest` asks of each candidate once it is open: OK to choose it,
// or why it does not read back (then the next older one is tried). An
// exception thrown from it leaves `OpenNewest` at once.
using AcceptCheckpoint = std::function<absl::Status(Reader&)>;

// Opens checkpoint `options.step`, or (unset) the newest one that opens and
// that `accept` takes, trying older ones in turn; each one passed over is
// given to `on_skip` (may be null) as it happens. With a step, that step's
// error is returned as it is. With none, the error listing the root, or
// `NewestFirst::NoneLeft()` when no checkpoint was taken.
absl::StatusOr<std::unique_ptr<Reader>> OpenNewest(
    const std::string& root, const ReaderOptions& options, const AcceptCheckpoint& accept,
    const std::function<void(const SkippedCheckpoint&)>& on_skip = nullptr);

// `OpenNewest` with `Reader::Verify`: the newest checkpoint whose every
// record verifies. `progress` (may be null) counts the tensor bytes checked,
// for each candidate in turn.
absl::StatusOr<std::unique_ptr<Reader>> OpenNewestVerified(
    const std::string& root, const ReaderOptions& options, const VerifyProgress& progress,
    const std::function<void(const SkippedCheckpoint&)>& on_skip = nullptr);

}  // namespace ckpt

#endif  // CKPT_NEWEST_H_
