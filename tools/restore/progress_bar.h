// tools/restore/progress_bar.h: a one-line progress bar for ckpt-restore's long
// operations (verify, export), drawn on stderr.
//
//   ProgressBar bar(std::cerr, ShowProgress(mode));
//   bar.Start("verifying step 300", total_bytes);
//   bar.Add(n);              // after each batch of tensors
//   bar.Clear();             // before printing any other line
//   bar.Finish();            // the final frame (100% when done) and '\n'
//
// The bar is redrawn in place with '\r' at most `kRedrawInterval` apart, so a
// fast loop costs no terminal writes. A disabled bar draws nothing: every call
// is a cheap no-op, so callers never test whether it is shown.
#ifndef CKPT_TOOLS_RESTORE_PROGRESS_BAR_H_
#define CKPT_TOOLS_RESTORE_PROGRESS_BAR_H_

#include <chrono>
#include <cstdint>
#include <ostream>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckpt::tools {

// When to draw a progress bar (--progress).
enum class ProgressMode {
  kAuto,    // when stderr is a terminal
  kAlways,  // even when stderr is a file or a pipe (tests, logs)
  kNever,
};

// `ParseProgressMode` reads "auto", "always" or "never"; anything else is
// kInvalidArgument with a one-line message.
absl::StatusOr<ProgressMode> ParseProgressMode(absl::string_view text);

// `ShowProgress` is whether `mode` draws a bar: kAuto asks
// isatty(STDERR_FILENO).
bool ShowProgress(ProgressMode mode);

// `TerminalColumns` is the width of the terminal on stderr, or 80 when stderr
// is not a terminal.
size_t TerminalColumns();

class ProgressBar {
 public:
  static constexpr std::chrono::milliseconds kRedrawInterval{100};

  // Draws on `out` when `enabled`; lines are cut to `columns - 1` characters
  // so that the terminal never wraps them.
  ProgressBar(std::ostream& out, bool enabled, size_t columns = 80);
  // Erases an unfinished line, so that an error message starts on a clean one.
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  bool enabled() const { return enabled_; }

  // Starts a new bar at 0 of `total` bytes, replacing the line of an
  // unfinished one. Draws at once.
  void Start(std::string label, uint64_t total);
  // Changes the text before the bar; shown with the next redraw.
  void SetLabel(std::string label);
  // Counts `bytes` more as done (never past the total) and redraws if the
  // last frame is at least `kRedrawInterval` old.
  void Add(uint64_t bytes);
  // Erases the line so that another line can be written to the terminal;
  // the next redraw puts the bar back.
  void Clear();
  // Draws the last frame and ends the line with '\n'. With `complete`, the
  // operation is done: the bar shows 100% whatever was counted.
  void Finish(bool complete = true);

 private:
  using Clock = std::chrono::steady_clock;

  void Draw();
  std::string Frame() const;

  std::ostream& out_;
  const bool enabled_;
  const size_t columns_;
  bool active_ = false;  // started and not finished
  std::string label_;
  uint64_t total_ = 0;
  uint64_t done_ = 0;
  size_t drawn_width_ = 0;  // characters on the line now; 0 when cleared
  Clock::time_point started_;
  Clock::time_point last_draw_;
};

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_RESTORE_PROGRESS_BAR_H_
