#include "ckpt/newest.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ckpt/catalog.h"

namespace ckpt {

absl::StatusOr<NewestFirst> NewestFirst::Start(const std::string& root,
                                               std::shared_ptr<FileSystem> fs) {
  absl::StatusOr<std::vector<int64_t>> steps = ListSteps(root, std::move(fs));
  if (!steps.ok()) return steps.status();
  return NewestFirst(std::move(*steps));
}

NewestFirst::NewestFirst(std::vector<int64_t> steps) : steps_(std::move(steps)) {
  std::sort(steps_.begin(), steps_.end());
}

std::optional<int64_t> NewestFirst::Next() {
  if (tried_ == steps_.size()) return std::nullopt;
  return steps_[steps_.size() - 1 - tried_++];
}

void NewestFirst::Skip(int64_t step, absl::Status why) {
  skipped_.push_back(SkippedCheckpoint{step, std::move(why)});
}

std::vector<std::string> NewestFirst::SkippedLines() const {
  std::vector<std::string> lines;
  lines.reserve(skipped_.size());
  for (const SkippedCheckpoint& s : skipped_) {
    lines.push_back(absl::StrCat("step ", s.step, ": ", s.why.ToString()));
  }
  return lines;
}

absl::Status NewestFirst::NoneLeft() const {
  if (steps_.empty()) return absl::NotFoundError("no committed checkpoint");
  return absl::NotFoundError(
      absl::StrCat("no checkpoint reads back intact (", absl::StrJoin(SkippedLines(), "; "), ")"));
}

absl::StatusOr<std::unique_ptr<Reader>> OpenNewest(
    const std::string& root, const ReaderOptions& options, const AcceptCheckpoint& accept,
    const std::function<void(const SkippedCheckpoint&)>& on_skip) {
  if (options.step.has_value()) {
    absl::StatusOr<std::unique_ptr<Reader>> reader = Reader::Open(root, options);
    if (!reader.ok()) return reader.status();
    absl::Status accepted = accept(**reader);
    if (!accepted.ok()) return accepted;
    return reader;
  }
  absl::StatusOr<NewestFirst> walk = NewestFirst::Start(root, options.fs);
  if (!walk.ok()) return walk.status();
  while (std::optional<int64_t> step = walk->Next()) {
    ReaderOptions one = options;
    one.step = *step;
    absl::StatusOr<std::unique_ptr<Reader>> reader = Reader::Open(root, one);
    absl::Status status = reader.ok() ? accept(**reader) : reader.status();
    if (status.ok()) return reader;
    walk->Skip(*step, status);
    if (on_skip) on_skip(walk->skipped().back());
  }
  return walk->NoneLeft();
}

absl::StatusOr<std::unique_ptr<Reader>> OpenNewestVerified(
    const std::string& root, const ReaderOptions& options, const VerifyProgress& progress,
    const std::function<void(const SkippedCheckpoint&)>& on_skip) {
  return OpenNewest(
      root, options, [&](Reader& reader) { return reader.Verify(progress); }, on_skip);
}

}  // namespace ckpt
