// tools/restore/progress_bar.cc: a one-line progress bar on stderr.
#include "restore/progress_bar.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "restore/format.h"

namespace ckpt::tools {

absl::StatusOr<ProgressMode> ParseProgressMode(absl::string_view text) {
  if (text == "auto") return ProgressMode::kAuto;
  if (text == "always") return ProgressMode::kAlways;
  if (text == "never") return ProgressMode::kNever;
  return absl::InvalidArgumentError(
      absl::StrCat("--progress must be auto, always or never, got '", text, "'"));
}

bool ShowProgress(ProgressMode mode) {
  switch (mode) {
    case ProgressMode::kAlways:
      return true;
    case ProgressMode::kNever:
      return false;
    case ProgressMode::kAuto:
      return isatty(STDERR_FILENO) == 1;
  }
  return false;
}

size_t TerminalColumns() {
  struct winsize size = {};
  if (isatty(STDERR_FILENO) == 1 && ioctl(STDERR_FILENO, TIOCGWINSZ, &size) == 0 &&
      size.ws_col > 0) {
    return size.ws_col;
  }
  return 80;
}

ProgressBar::ProgressBar(std::ostream& out, bool enabled, size_t columns)
    : out_(out), enabled_(enabled), columns_(std::max<size_t>(columns, 2)) {}

ProgressBar::~ProgressBar() {
  if (active_) Clear();
}

void ProgressBar::Start(std::string label, uint64_t total) {
  if (!enabled_) return;
  Clear();
  active_ = true;
  label_ = std::move(label);
  total_ = total;
  done_ = 0;
  started_ = Clock::now();
  Draw();
}

void ProgressBar::SetLabel(std::string label) {
  if (enabled_) label_ = std::move(label);
}

void ProgressBar::Add(uint64_t bytes) {
  if (!enabled_ || !active_) return;
  done_ = bytes >= total_ - done_ ? total_ : done_ + bytes;
  if (Clock::now() - last_draw_ >= kRedrawInterval) Draw();
}

void ProgressBar::Clear() {
  if (!enabled_ || drawn_width_ == 0) return;
  out_ << '\r' << std::string(drawn_width_, ' ') << '\r';
  out_.flush();
  drawn_width_ = 0;
}

void ProgressBar::Finish(bool complete) {
  if (!enabled_ || !active_) return;
  if (complete) done_ = total_;
  Draw();
  out_ << '\n';
  out_.flush();
  drawn_width_ = 0;
  active_ = false;
}

void ProgressBar::Draw() {
  std::string frame = Frame();
  // Pad over the rest of a longer previous frame.
  const size_t width = frame.size();
  if (width < drawn_width_) frame.append(drawn_width_ - width, ' ');
  out_ << '\r' << frame;
  out_.flush();
  drawn_width_ = std::max(width, drawn_width_);
  last_draw_ = Clock::now();
}

std::string ProgressBar::Frame() const {
  constexpr size_t kBarWidth = 20;
  // 0 of 0 bytes is done: an empty checkpoint verifies at once.
  const double fraction = total_ == 0 ? 1.0 : static_cast<double>(done_) / total_;
  const size_t filled = std::min(kBarWidth, static_cast<size_t>(fraction * kBarWidth));
  // Rounded down: 100% only at the end.
  const int percent = total_ == 0 ? 100 : static_cast<int>(done_ * 100.0 / total_);
  const std::string bar = absl::StrFormat("  [%s%s] %3d%%", std::string(filled, '#'),
                                          std::string(kBarWidth - filled, '-'), percent);
  const std::string bytes = absl::StrCat("  ", HumanBytes(done_), " / ", HumanBytes(total_));
  std::string rate;
  const double seconds = std::chrono::duration<double>(Clock::now() - started_).count();
  if (seconds >= 0.5) rate = absl::StrCat("  ", HumanBytes(done_ / seconds), "/s");
  // What does not fit goes: first the rate, then the byte counts, then the
  // end of the label.
  const size_t room = columns_ - 1;
  std::string tail = bar + bytes + rate;
  if (label_.size() + tail.size() > room) tail = bar + bytes;
  if (label_.size() + tail.size() > room) tail = bar;
  std::string label = label_;
  if (label.size() + tail.size() > room) {
    label.resize(room > tail.size() + 3 ? room - tail.size() - 3 : 0);
    if (!label.empty()) label += "...";
  }
  std::string frame = label + tail;
  if (frame.size() > room) frame.resize(room);
  return frame;
}

}  // namespace ckpt::tools
