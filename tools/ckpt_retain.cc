// ckpt-retain: the retention/tiering job, meant for cron. See docs/retention.md.
#include <stdlib.h>

#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "retention.h"

ABSL_FLAG(std::string, root, "", "Checkpoint root directory (required).");
ABSL_FLAG(int, keep_last, 0, "Keep the newest N checkpoints.");
ABSL_FLAG(int64_t, keep_every, 0, "Keep every checkpoint whose step is a multiple of K.");
ABSL_FLAG(absl::Duration, keep_newer_than, absl::ZeroDuration(),
          "Keep checkpoints created within this long (e.g. 24h).");
ABSL_FLAG(std::string, cold_dir, "",
          "Move checkpoints no rule keeps to this directory (another file system is fine) "
          "instead of deleting them: copy, fsync, verify, rename, fsync, then remove the hot copy.");
ABSL_FLAG(absl::Duration, stale_temp_age, absl::Hours(1),
          "Remove .tmp-/.trash- entries (abandoned saves and removals) untouched for this long.");
ABSL_FLAG(bool, compact, true,
          "Rewrite a kept delta as a full checkpoint when that frees more bytes than it writes, "
          "so that its bases can go; and write a delta that moves to --cold_dir while its base "
          "stays as a full checkpoint there. false: kept deltas keep every base, and a delta "
          "whose base stays stays too.");
ABSL_FLAG(bool, dry_run, false, "Print the plan; change nothing.");
ABSL_FLAG(bool, json, false, "One JSON object per action instead of text.");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "ckpt-retain --root DIR [--keep_last N] [--keep_every K] [--keep_newer_than D] "
      "[--cold_dir DIR] [--compact=false] [--dry_run] [--json]\n"
      "Always kept: the newest checkpoint and the one LATEST names, with their whole chains; a "
      "kept delta is compacted into a full checkpoint, or keeps its bases. Exit codes: 0 done, 1 some action failed, 2 usage error, 3 ROOT or --cold-dir "
      "missing, 4 another ckpt-retain is running or other error.");
  absl::ParseCommandLine(argc, argv);
  auto fail = [](int code, const std::string& message) {
    std::cerr << "ckpt-retain: " << message << std::endl;
    return code;
  };
  ckpt::tools::RetentionPolicy policy;
  const std::string root = absl::GetFlag(FLAGS_root);
  policy.keep_last = absl::GetFlag(FLAGS_keep_last);
  policy.keep_every = absl::GetFlag(FLAGS_keep_every);
  policy.keep_newer_than = absl::GetFlag(FLAGS_keep_newer_than);
  policy.cold_dir = absl::GetFlag(FLAGS_cold_dir);
  policy.stale_temp_age = absl::GetFlag(FLAGS_stale_temp_age);
  policy.compact = absl::GetFlag(FLAGS_compact);
  policy.dry_run = absl::GetFlag(FLAGS_dry_run);
  // The library logs each compaction's I/O choices at info level to stderr;
  // keep that out of JSON output that cron may append stderr to.
  if (absl::GetFlag(FLAGS_json)) setenv("CKPT_LOG", "warning", /*overwrite=*/0);
  if (root.empty()) return fail(2, "--root DIR is required");
  if (policy.keep_last < 0 || policy.keep_every < 0 || policy.keep_newer_than < absl::ZeroDuration()) {
    return fail(2, "--keep_last, --keep_every and --keep_newer_than must not be negative");
  }
  if (policy.keep_last == 0 && policy.keep_every == 0 && policy.keep_newer_than == absl::ZeroDuration()) {
    return fail(2, "give at least one of --keep_last, --keep_every, --keep_newer_than "
                   "(refusing to remove every checkpoint but the newest)");
  }
  auto actions = ckpt::tools::RunRetention(root, policy);
  if (!actions.ok()) {
    const auto code = actions.status().code();
    return fail(code == absl::StatusCode::kNotFound ? 3
                : code == absl::StatusCode::kInvalidArgument ||
                        code == absl::StatusCode::kFailedPrecondition
                    ? 2
                    : 4,
                std::string(actions.status().message()));
  }
  int failed = 0;
  for (const auto& a : *actions) {
    if (!a.error.empty()) ++failed;
    if (absl::GetFlag(FLAGS_json)) {
      nlohmann::json j = {{"action", ckpt::tools::ActionName(a.kind)}, {"name", a.name},
                          {"reason", a.reason}, {"dry_run", policy.dry_run}, {"done", a.done}};
      if (a.step >= 0) j["step"] = a.step;
      if (!a.error.empty()) j["error"] = a.error;
      std::cout << j.dump() << "\n";
    } else {
      std::cout << (policy.dry_run ? "would " : "") << ckpt::tools::ActionName(a.kind) << " "
                << a.name << " (" << a.reason << ")"
                << (a.error.empty() ? "" : absl::StrCat(": FAILED: ", a.error)) << "\n";
    }
  }
  return failed == 0 ? 0 : 1;
}
