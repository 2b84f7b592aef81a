// tools/restore/output.h: where a ckpt-restore run writes, for the verbs in
// this folder.
#ifndef CKPT_TOOLS_RESTORE_OUTPUT_H_
#define CKPT_TOOLS_RESTORE_OUTPUT_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "restore/progress_bar.h"

namespace ckpt::tools {

using Json = nlohmann::json;

// `Output` is the run's results stream (`out`), its diagnostics stream
// (`err`) and the progress bar drawn on `err`. Every write erases the bar
// first, so that no line is ever written into the middle of it.
class Output {
 public:
  Output(std::ostream& out, std::ostream& err, ProgressBar& bar)
      : out_(out), err_(err), bar_(bar) {}

  // The results stream, with the bar erased; it is redrawn on its next update.
  std::ostream& out() {
    bar_.Clear();
    return out_;
  }
  ProgressBar& bar() { return bar_; }

  // Writes `message` as one line "ckpt-restore: message" on `err`.
  void Warn(absl::string_view message);
  // Warns and returns `code`, for `return output.Fail(kExitX, "...")`.
  int Fail(int code, absl::string_view message);
  // One JSON Lines record on `out`. Invalid UTF-8 (paths are bytes) is
  // replaced rather than thrown on.
  void PrintJson(const Json& json);

 private:
  std::ostream& out_;
  std::ostream& err_;
  ProgressBar& bar_;
};

// `DescribeSteps` is "step 100", "steps 100, 200, 300" or, for many,
// "12 steps from 100 to 1200".
std::string DescribeSteps(const std::vector<int64_t>& steps);

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_RESTORE_OUTPUT_H_
