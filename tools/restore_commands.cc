// tools/restore_commands.cc: the verbs of ckpt-restore.
#include "restore_commands.h"

#include "safetensors_export.h"

#include <algorithm>
#include <memory>
#include <set>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "ckpt/catalog.h"
#include "ckpt/file_system.h"
#include "ckpt/reader.h"
#include "nlohmann/json.hpp"
#include "restore_format.h"

namespace ckpt::tools {
namespace {

using Json = nlohmann::json;

// Writes `message` as one line to `err` and returns `code`.
int Fail(std::ostream& err, int code, std::string_view message) {
  err << kToolName << ": " << message << "\n";
  return code;
}

void Warn(std::ostream& err, std::string_view message) {
  err << kToolName << ": " << message << "\n";
}

// One JSON Lines record. Invalid UTF-8 (paths are bytes) is replaced rather
// than thrown on.
void PrintJson(std::ostream& out, const Json& json) {
  out << json.dump(-1, ' ', false, Json::error_handler_t::replace) << "\n";
}

// "step 100", "steps 100, 200, 300" or, for many, "12 steps from 100 to 1200".
std::string DescribeSteps(const std::vector<int64_t>& steps) {
  if (steps.size() == 1) return absl::StrCat("step ", steps[0]);
  if (steps.size() <= 8) return absl::StrCat("steps ", absl::StrJoin(steps, ", "));
  return absl::StrFormat("%d steps from %d to %d", steps.size(), steps.front(), steps.back());
}

// Checks that ROOT is a directory holding committed checkpoints and lists
// their steps, ascending. On failure writes the error and returns its code.
int LoadSteps(const std::string& root, std::ostream& err, std::vector<int64_t>* steps) {
  std::shared_ptr<FileSystem> fs = PosixFileSystem();
  absl::StatusOr<FileStat> stat = fs->Stat(root);
  if (!stat.ok()) {
    if (absl::IsNotFound(stat.status())) {
      return Fail(err, kExitNotFound, absl::StrFormat("ROOT %s does not exist", root));
    }
    return Fail(err, kExitError,
                absl::StrFormat("cannot stat ROOT %s: %s", root, StatusText(stat.status())));
  }
  if (!stat->is_directory) {
    return Fail(err, kExitNotFound, absl::StrFormat("ROOT %s is not a directory", root));
  }
  absl::StatusOr<std::vector<int64_t>> listed = ListSteps(root, fs);
  if (!listed.ok()) {
    return Fail(err, kExitError,
                absl::StrFormat("cannot list ROOT %s: %s", root, StatusText(listed.status())));
  }
  if (listed->empty()) {
    return Fail(err, kExitNotFound,
                absl::StrFormat("no committed checkpoints in %s (no step-* directories)", root));
  }
  *steps = std::move(*listed);
  std::sort(steps->begin(), steps->end());
  return kExitOk;
}

// What a checkpoint holds, as its manifest describes it.
struct Contents {
  size_t tensor_count = 0;
  uint64_t tensor_bytes = 0;
  size_t shard_count = 0;
};

Contents Summarize(const Reader& reader) {
  Contents contents;
  std::set<std::string_view> shards;
  for (const TensorInfo& tensor : reader.tensors()) {
    ++contents.tensor_count;
    contents.tensor_bytes += tensor.raw_bytes;
    shards.insert(tensor.shard);
  }
  contents.shard_count = shards.size();
  return contents;
}

std::string DescribeContents(const Contents& c) {
  return absl::StrFormat("%d tensors, %s in %d shard%s", c.tensor_count,
                         HumanBytes(c.tensor_bytes), c.shard_count, c.shard_count == 1 ? "" : "s");
}

// Opens checkpoint `step` (its manifest is checked) and, with `verify`, reads
// every record and checks every checksum.
absl::StatusOr<std::unique_ptr<Reader>> OpenStep(const std::string& root, int64_t step,
                                                 bool verify) {
  ReaderOptions options;
  options.step = step;
  absl::StatusOr<std::unique_ptr<Reader>> reader = Reader::Open(root, options);
  if (!reader.ok()) return reader.status();
  if ((*reader)->step() != step) {
    return absl::InternalError(
        absl::StrFormat("asked for step %d, the reader opened step %d", step, (*reader)->step()));
  }
  if (verify) {
    absl::Status verified = (*reader)->Verify();
    if (!verified.ok()) return verified;
  }
  return reader;
}

// Prints one verification result: a table line, or a JSON record.
void PrintVerifyResult(const RestoreRequest& request, int64_t step,
                       const absl::StatusOr<std::unique_ptr<Reader>>& result, std::ostream& out) {
  if (request.json) {
    Json json = {{"step", step}, {"ok", result.ok()}, {"error", nullptr}};
    if (result.ok()) {
      const Contents c = Summarize(**result);
      json["tensor_count"] = c.tensor_count;
      json["tensor_bytes"] = c.tensor_bytes;
      json["shard_count"] = c.shard_count;
    } else {
      json["error"] = StatusText(result.status());
    }
    PrintJson(out, json);
  } else if (result.ok()) {
    out << absl::StrFormat("step %d: ok (%s)\n", step, DescribeContents(Summarize(**result)));
  } else {
    out << absl::StrFormat("step %d: FAILED: %s\n", step, StatusText(result.status()));
  }
}

// Finds the newest checkpoint that fully verifies, trying newest first. Each
// newer one that fails is reported on `err` (and, for --verify --json, as a
// record on `out`). On failure writes the error and returns its code.
int SelectLatest(const RestoreRequest& request, const std::vector<int64_t>& steps,
                 std::ostream& out, std::ostream& err, std::unique_ptr<Reader>* chosen) {
  std::vector<int64_t> skipped;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    absl::StatusOr<std::unique_ptr<Reader>> reader = OpenStep(request.root, *it, /*verify=*/true);
    if (request.action == Action::kVerify) PrintVerifyResult(request, *it, reader, out);
    if (reader.ok()) {
      if (!skipped.empty()) {
        Warn(err, absl::StrFormat(
                      "fell back to step %d, the newest checkpoint that verifies (skipped %s)",
                      *it, absl::StrJoin(skipped, ", ")));
      }
      *chosen = std::move(*reader);
      return kExitOk;
    }
    Warn(err, absl::StrFormat("skipped step %d: %s", *it, StatusText(reader.status())));
    skipped.push_back(*it);
  }
  return Fail(err, kExitDataLoss,
              absl::StrFormat("no checkpoint in %s verifies (tried %s)", request.root,
                              DescribeSteps(steps)));
}

// Fails unless `step` is one of `steps`.
int CheckStepExists(const RestoreRequest& request, const std::vector<int64_t>& steps,
                    std::ostream& err) {
  if (std::binary_search(steps.begin(), steps.end(), request.step)) return kExitOk;
  return Fail(err, kExitNotFound,
              absl::StrFormat("no checkpoint at step %d in %s (it has %s)", request.step,
                              request.root, DescribeSteps(steps)));
}

int RunList(const RestoreRequest& request, std::ostream& out, std::ostream& err) {
  absl::StatusOr<std::vector<CheckpointSummary>> summaries = ListCheckpoints(request.root);
  if (!summaries.ok()) {
    return Fail(err, kExitError, absl::StrFormat("cannot list %s: %s", request.root,
                                                 StatusText(summaries.status())));
  }
  absl::StatusOr<std::optional<int64_t>> hint = ReadLatestHint(request.root);
  // -1 (no step) when LATEST is missing or unreadable.
  const int64_t latest = hint.ok() && hint->has_value() ? **hint : -1;
  if (request.json) {
    for (const CheckpointSummary& s : *summaries) {
      const bool ok = s.manifest_status.ok();
      PrintJson(out, {{"step", s.step},
                      {"kind", s.kind},
                      {"base_step", s.kind == "delta" ? Json(s.base_step) : Json(nullptr)},
                      {"exact", s.delta_mode != "topk"},
                      {"error_bound", s.max_error_bound},
                      {"file_bytes", s.file_bytes},
                      {"tensor_bytes", s.tensor_bytes},
                      {"tensor_count", s.tensor_count},
                      {"shard_count", s.shard_count},
                      {"created_unix_ns", s.created_unix_ns},
                      {"ok", ok},
                      {"error", ok ? Json(nullptr) : Json(StatusText(s.manifest_status))},
                      {"latest", latest == s.step},
                      {"dir", s.dir}});
    }
    return kExitOk;
  }
  Table table({"STEP", "KIND", "EXACT", "SIZE", "TENSORS", "SHARDS", "CREATED (UTC)", "MANIFEST"},
              {true, false, false, true, true, true, false, false});
  for (const CheckpointSummary& s : *summaries) {
    const bool ok = s.manifest_status.ok();
    const std::string kind = s.kind == "delta" ? absl::StrCat("delta of ", s.base_step) : s.kind;
    const std::string exact = s.delta_mode == "topk"
                                  ? absl::StrFormat("lossy <= %.3g", s.max_error_bound)
                                  : "exact";
    table.AddRow({absl::StrCat(s.step, latest == s.step ? "*" : ""), ok ? kind : "-",
                  ok ? exact : "-", ok ? HumanBytes(s.file_bytes) : "-", ok ? absl::StrCat(s.tensor_count) : "-",
                  ok ? absl::StrCat(s.shard_count) : "-", ok ? FormatUtc(s.created_unix_ns) : "-",
                  ok ? "ok" : absl::StrCat("DAMAGED: ", StatusText(s.manifest_status))});
  }
  table.Print(out);
  if (!hint.ok()) {
    out << "LATEST: unreadable: " << StatusText(hint.status()) << "\n";
  } else if (latest < 0) {
    out << "LATEST: missing\n";
  } else if (std::none_of(summaries->begin(), summaries->end(),
                          [&](const CheckpointSummary& s) { return s.step == latest; })) {
    out << absl::StrFormat("LATEST: names step %d, which is not committed\n", latest);
  } else {
    out << absl::StrFormat("* = named by LATEST (a hint; --latest verifies)\n");
  }
  return kExitOk;
}

int RunVerify(const RestoreRequest& request, const std::vector<int64_t>& steps,
              std::ostream& out, std::ostream& err) {
  if (request.selection == Selection::kLatest) {
    std::unique_ptr<Reader> chosen;
    if (int code = SelectLatest(request, steps, out, err, &chosen); code != kExitOk) return code;
    if (!request.json) {
      out << absl::StrFormat("newest checkpoint that verifies: step %d (%s)\n", chosen->step(),
                             chosen->dir());
    }
    return kExitOk;
  }
  std::vector<int64_t> targets = steps;
  if (request.selection == Selection::kStep) targets = {request.step};
  std::vector<int64_t> failed;
  for (int64_t step : targets) {
    absl::StatusOr<std::unique_ptr<Reader>> reader = OpenStep(request.root, step, /*verify=*/true);
    PrintVerifyResult(request, step, reader, out);
    if (!reader.ok()) failed.push_back(step);
  }
  if (failed.empty()) return kExitOk;
  return Fail(err, kExitDataLoss,
              absl::StrFormat("verification failed for %d of %d checkpoint%s: %s", failed.size(),
                              targets.size(), targets.size() == 1 ? "" : "s",
                              DescribeSteps(failed)));
}

// Prints a checkpoint's extras and tensors.
void PrintContents(const RestoreRequest& request, const Reader& reader, std::ostream& out) {
  const Contents c = Summarize(reader);
  if (request.json) {
    Json tensors = Json::array();
    for (const TensorInfo& t : reader.tensors()) {
      tensors.push_back({{"name", t.name},
                         {"dtype", std::string(DTypeName(t.dtype))},
                         {"shape", t.shape},
                         {"raw_bytes", t.raw_bytes},
                         {"stored_bytes", t.stored_bytes},
                         {"encoding", t.encoding},
                         {"shard", t.shard},
                         {"offset", t.offset},
                         {"xxh3", absl::StrFormat("%016x", t.xxh3)}});
    }
    Json extras = Json::parse(reader.extras_json(), nullptr, /*allow_exceptions=*/false);
    if (extras.is_discarded()) extras = reader.extras_json();
    PrintJson(out, {{"step", reader.step()},
                    {"dir", reader.dir()},
                    {"verified", request.selection == Selection::kLatest},
                    {"extras", extras},
                    {"tensor_count", c.tensor_count},
                    {"tensor_bytes", c.tensor_bytes},
                    {"shard_count", c.shard_count},
                    {"tensors", tensors}});
    return;
  }
  out << absl::StrFormat("step %d  %s\n", reader.step(), reader.dir());
  out << "extras: " << reader.extras_json() << "\n";
  Table table({"NAME", "DTYPE", "SHAPE", "BYTES", "SHARD"}, {false, false, false, true, false});
  for (const TensorInfo& t : reader.tensors()) {
    table.AddRow({t.name, std::string(DTypeName(t.dtype)), FormatShape(t.shape),
                  absl::StrCat(t.raw_bytes), t.shard});
  }
  table.Print(out);
  out << DescribeContents(c)
      << (request.selection == Selection::kLatest ? "; every checksum verified\n"
                                                  : "; manifest checked, data not read "
                                                    "(--verify reads it)\n");
}

int RunShow(const RestoreRequest& request, const std::vector<int64_t>& steps, std::ostream& out,
            std::ostream& err) {
  std::unique_ptr<Reader> reader;
  if (request.selection == Selection::kLatest) {
    if (int code = SelectLatest(request, steps, out, err, &reader); code != kExitOk) return code;
  } else {
    absl::StatusOr<std::unique_ptr<Reader>> opened =
        OpenStep(request.root, request.step, /*verify=*/false);
    if (!opened.ok()) {
      return Fail(err, kExitDataLoss,
                  absl::StrFormat("step %d: %s", request.step, StatusText(opened.status())));
    }
    reader = std::move(*opened);
  }
  if (!request.export_path.empty()) {
    absl::StatusOr<ExportResult> exported =
        ExportSafetensors(*reader, request.export_filter, request.export_path);
    if (!exported.ok()) {
      const int code = exported.status().code() == absl::StatusCode::kDataLoss ? kExitDataLoss
                       : exported.status().code() == absl::StatusCode::kInternal ? kExitError
                                                                                 : kExitUsage;
      return Fail(err, code, absl::StrFormat("step %d: %s", reader->step(),
                                             StatusText(exported.status())));
    }
    out << absl::StrFormat("wrote %s: step %d, %d tensors, %d bytes\n", request.export_path,
                           reader->step(), exported->tensors, exported->bytes);
    return kExitOk;
  }
  PrintContents(request, *reader, out);
  return kExitOk;
}

}  // namespace

absl::StatusOr<RestoreRequest> MakeRequest(const RestoreFlags& flags) {
  if (flags.root.empty()) {
    return absl::InvalidArgumentError("--root DIR is required (the checkpoint root directory)");
  }
  if (flags.list && flags.verify) {
    return absl::InvalidArgumentError("--list and --verify are separate actions; give one");
  }
  if (flags.step.has_value() && flags.latest) {
    return absl::InvalidArgumentError("--step and --latest both select a checkpoint; give one");
  }
  if (flags.all && (flags.step.has_value() || flags.latest)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--all selects every checkpoint; it conflicts with ",
        flags.latest ? "--latest" : "--step"));
  }
  if (flags.step.has_value() && *flags.step < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--step must be a step number >= 0, got %d", *flags.step));
  }
  if (flags.list && (flags.step.has_value() || flags.latest)) {
    return absl::InvalidArgumentError(
        "--list lists every checkpoint; it takes no --step or --latest "
        "(use --step N or --latest alone to show one)");
  }
  if (!flags.filter.empty() && flags.out.empty()) {
    return absl::InvalidArgumentError("--filter selects tensors for --out; give --out FILE");
  }
  if (!flags.out.empty() && (flags.list || flags.verify || flags.all)) {
    return absl::InvalidArgumentError("--out exports one checkpoint; it conflicts with --list, --verify and --all");
  }
  if (!flags.out.empty() && !flags.step.has_value() && !flags.latest) {
    return absl::InvalidArgumentError("--out needs --step N or --latest");
  }
  RestoreRequest request;
  request.root = flags.root;
  request.export_path = flags.out;
  request.export_filter = flags.filter;
  request.json = flags.json;
  request.action = flags.list ? Action::kList : flags.verify ? Action::kVerify : Action::kShow;
  if (flags.step.has_value()) {
    request.selection = Selection::kStep;
    request.step = *flags.step;
  } else if (flags.latest) {
    request.selection = Selection::kLatest;
  }
  if (request.action == Action::kShow) {
    if (flags.all) {
      return absl::InvalidArgumentError("--all needs an action: --verify (or --list)");
    }
    if (request.selection == Selection::kAll) {
      return absl::InvalidArgumentError(
          "nothing to do: give --list, --verify, --step N or --latest");
    }
  }
  return request;
}

int RunRestore(const RestoreRequest& request, std::ostream& out, std::ostream& err) {
  std::vector<int64_t> steps;
  if (int code = LoadSteps(request.root, err, &steps); code != kExitOk) return code;
  if (request.selection == Selection::kStep) {
    if (int code = CheckStepExists(request, steps, err); code != kExitOk) return code;
  }
  switch (request.action) {
    case Action::kList:
      return RunList(request, out, err);
    case Action::kVerify:
      return RunVerify(request, steps, out, err);
    case Action::kShow:
      return RunShow(request, steps, out, err);
  }
  return Fail(err, kExitError, "internal error: unknown action");
}

}  // namespace ckpt::tools
