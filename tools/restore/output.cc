// tools/restore/output.cc: where a ckpt-restore run writes.
#include "restore/output.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "restore/commands.h"

namespace ckpt::tools {

void Output::Warn(absl::string_view message) {
  bar_.Clear();
  out_.flush();  // what was printed before the problem shows before it
  err_ << kToolName << ": " << message << "\n";
  err_.flush();
}

int Output::Fail(int code, absl::string_view message) {
  Warn(message);
  return code;
}

void Output::PrintJson(const Json& json) {
  out() << json.dump(-1, ' ', false, Json::error_handler_t::replace) << "\n";
}

std::string DescribeSteps(const std::vector<int64_t>& steps) {
  if (steps.size() == 1) return absl::StrCat("step ", steps[0]);
  if (steps.size() <= 8) return absl::StrCat("steps ", absl::StrJoin(steps, ", "));
  return absl::StrFormat("%d steps from %d to %d", steps.size(), steps.front(), steps.back());
}

}  // namespace ckpt::tools
