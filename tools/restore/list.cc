// tools/restore/list.cc: ckpt-restore --list [--verify].
#include "restore/list.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ckpt/catalog.h"
#include "restore/format.h"
#include "restore/verify.h"

namespace ckpt::tools {
namespace {

// Verifies every listed checkpoint, one progress bar over all of them.
std::map<int64_t, absl::Status> VerifyAll(const std::string& root,
                                          const std::vector<CheckpointSummary>& summaries,
                                          ProgressBar& bar) {
  uint64_t total = 0;
  for (const CheckpointSummary& s : summaries) total += s.tensor_bytes;
  auto label = [&](size_t i) {
    return absl::StrFormat("verifying step %d (%d of %d)", summaries[i].step, i + 1,
                           summaries.size());
  };
  bar.Start(summaries.empty() ? "verifying" : label(0), total);
  std::map<int64_t, absl::Status> verified;
  for (size_t i = 0; i < summaries.size(); ++i) {
    const CheckpointSummary& s = summaries[i];
    bar.SetLabel(label(i));
    verified[s.step] = VerifyStep(root, s.step, bar, s.tensor_bytes).status();
  }
  bar.Finish();
  return verified;
}

// A top-k delta, or a checkpoint compacted from one: its values may differ
// from the saved ones by up to the recorded bound.
bool IsLossy(const CheckpointSummary& s) {
  return s.delta_mode == DeltaOptions::Mode::kTopK || s.max_error_bound > 0;
}

void PrintJsonRows(const std::vector<CheckpointSummary>& summaries, int64_t latest,
                   const std::map<int64_t, absl::Status>* verified, Output& output) {
  for (const CheckpointSummary& s : summaries) {
    const bool ok = s.manifest_status.ok();
    // With --verify, `error` says why the checkpoint does not verify, which
    // covers a damaged manifest too.
    const absl::Status& error = verified != nullptr ? verified->at(s.step) : s.manifest_status;
    Json row = {{"step", s.step},
                {"kind", ok ? CheckpointKindName(s.kind) : ""},  // "" for a damaged manifest
                {"base_step", ok && s.kind == CheckpointKind::kDelta ? Json(s.base_step) : Json(nullptr)},
                {"compacted", s.compacted},
                // How many ranks wrote it (1: one process); 0 for a damaged manifest.
                {"world_size", ok ? s.world_size : 0},
                {"exact", !IsLossy(s)},
                {"error_bound", s.max_error_bound},
                {"file_bytes", s.file_bytes},
                {"tensor_bytes", s.tensor_bytes},
                {"tensor_count", s.tensor_count},
                {"shard_count", s.shard_count},
                {"created_unix_ns", s.created_unix_ns},
                {"ok", ok}};
    if (verified != nullptr) row["verified"] = error.ok();
    row["error"] = error.ok() ? Json(nullptr) : Json(StatusText(error));
    row["latest"] = latest == s.step;
    row["dir"] = s.dir;
    output.PrintJson(row);
  }
}

void PrintTable(const std::vector<CheckpointSummary>& summaries, int64_t latest,
                const std::map<int64_t, absl::Status>* verified, Output& output) {
  std::vector<std::string> header = {"STEP",    "KIND",    "RANKS",         "EXACT",   "SIZE",
                                     "TENSORS", "SHARDS",  "CREATED (UTC)", "MANIFEST"};
  if (verified != nullptr) header.push_back("VERIFIED");
  Table table(header, {true, false, true, false, true, true, true, false, false, false});
  for (const CheckpointSummary& s : summaries) {
    const bool ok = s.manifest_status.ok();
    const std::string kind = s.kind == CheckpointKind::kDelta
                                 ? absl::StrCat("delta of ", s.base_step)
                                 : absl::StrCat(CheckpointKindName(s.kind),
                                                s.compacted ? " (compacted)" : "");
    const std::string exact = IsLossy(s)
                                  ? absl::StrFormat("lossy <= %.3g", s.max_error_bound)
                                  : "exact";
    // The last column holds the long reason; with --verify that is VERIFIED.
    std::string manifest = "ok";
    if (!ok) {
      manifest = verified != nullptr ? "DAMAGED"
                                     : absl::StrCat("DAMAGED: ", StatusText(s.manifest_status));
    }
    std::vector<std::string> row = {absl::StrCat(s.step, latest == s.step ? "*" : ""),
                                    ok ? kind : "-",
                                    ok ? absl::StrCat(s.world_size) : "-",
                                    ok ? exact : "-",
                                    ok ? HumanBytes(s.file_bytes) : "-",
                                    ok ? absl::StrCat(s.tensor_count) : "-",
                                    ok ? absl::StrCat(s.shard_count) : "-",
                                    ok ? FormatUtc(s.created_unix_ns) : "-",
                                    manifest};
    if (verified != nullptr) {
      const absl::Status& status = verified->at(s.step);
      row.push_back(status.ok() ? "ok" : absl::StrCat("FAILED: ", StatusText(status)));
    }
    table.AddRow(std::move(row));
  }
  table.Print(output.out());
}

// The footer about ROOT/LATEST under the table.
void PrintLatestFooter(const std::vector<CheckpointSummary>& summaries,
                       const absl::StatusOr<std::optional<int64_t>>& hint, int64_t latest,
                       Output& output) {
  std::ostream& out = output.out();
  if (!hint.ok()) {
    out << "LATEST: unreadable: " << StatusText(hint.status()) << "\n";
  } else if (latest < 0) {
    out << "LATEST: missing\n";
  } else if (std::none_of(summaries.begin(), summaries.end(),
                          [&](const CheckpointSummary& s) { return s.step == latest; })) {
    out << absl::StrFormat("LATEST: names step %d, which is not committed\n", latest);
  } else {
    out << "* = named by LATEST (a hint; --latest verifies)\n";
  }
}

}  // namespace

int RunList(const RestoreRequest& request, Output& output) {
  absl::StatusOr<std::vector<CheckpointSummary>> summaries = ListCheckpoints(request.root);
  if (!summaries.ok()) {
    return output.Fail(kExitError, absl::StrFormat("cannot list %s: %s", request.root,
                                                   StatusText(summaries.status())));
  }
  std::optional<std::map<int64_t, absl::Status>> verified;
  if (request.verify) verified = VerifyAll(request.root, *summaries, output.bar());
  const std::map<int64_t, absl::Status>* results = verified ? &*verified : nullptr;

  absl::StatusOr<std::optional<int64_t>> hint = ReadLatestHint(request.root);
  // -1 (no step) when LATEST is missing or unreadable.
  const int64_t latest = hint.ok() && hint->has_value() ? **hint : -1;
  if (request.json) {
    PrintJsonRows(*summaries, latest, results, output);
  } else {
    PrintTable(*summaries, latest, results, output);
    PrintLatestFooter(*summaries, hint, latest, output);
  }
  if (!verified) return kExitOk;
  std::vector<int64_t> failed;
  for (const auto& [step, status] : *verified) {
    if (!status.ok()) failed.push_back(step);
  }
  if (failed.empty()) return kExitOk;
  return output.Fail(kExitDataLoss,
                     absl::StrFormat("verification failed for %d of %d checkpoint%s: %s",
                                     failed.size(), verified->size(),
                                     verified->size() == 1 ? "" : "s", DescribeSteps(failed)));
}

}  // namespace ckpt::tools
