// tools/restore/commands.cc: the verbs of ckpt-restore (--list is in
// list.cc). (Over 400 lines: show, verify, restore and export, each short,
// share the request checks and output helpers here.)
#include "restore/commands.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "ckpt/catalog.h"
#include "ckpt/distributed.h"
#include "ckpt/file_system.h"
#include "ckpt/json.h"
#include "ckpt/newest.h"
#include "ckpt/reader.h"
#include "ckpt/safetensors.h"
#include "restore/format.h"
#include "restore/list.h"
#include "ckpt/object_store.h"
#include "restore/output.h"
#include "restore/verify.h"

namespace ckpt::tools {
namespace {

// Checks that ROOT is a directory holding committed checkpoints and lists
// their steps, ascending. On failure writes the error and returns its code.
int LoadSteps(const std::string& root, Output& output, std::vector<int64_t>* steps) {
  absl::StatusOr<std::shared_ptr<FileSystem>> opened = FileSystemForRoot(root);
  if (!opened.ok()) {
    return output.Fail(kExitError, absl::StrFormat("cannot open ROOT %s: %s", root,
                                                   StatusText(opened.status())));
  }
  std::shared_ptr<FileSystem> fs = *opened;
  absl::StatusOr<FileStat> stat = fs->Stat(root);
  if (!stat.ok()) {
    if (absl::IsNotFound(stat.status())) {
      return output.Fail(kExitNotFound, absl::StrFormat("ROOT %s does not exist", root));
    }
    return output.Fail(kExitError, absl::StrFormat("cannot stat ROOT %s: %s", root,
                                                   StatusText(stat.status())));
  }
  if (!stat->is_directory) {
    return output.Fail(kExitNotFound, absl::StrFormat("ROOT %s is not a directory", root));
  }
  absl::StatusOr<std::vector<int64_t>> listed = ListSteps(root, fs);
  if (!listed.ok()) {
    return output.Fail(kExitError, absl::StrFormat("cannot list ROOT %s: %s", root,
                                                   StatusText(listed.status())));
  }
  if (listed->empty()) {
    return output.Fail(kExitNotFound,
                       absl::StrFormat("no committed checkpoints in %s (no step-* directories)",
                                       root));
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
    if (tensor.chunks.empty()) shards.insert(tensor.shard);
    for (const TensorInfo::Chunk& chunk : tensor.chunks) shards.insert(chunk.shard);
  }
  contents.shard_count = shards.size();
  return contents;
}

std::string DescribeContents(const Contents& c) {
  return absl::StrFormat("%d tensors, %s in %d shard%s", c.tensor_count,
                         HumanBytes(c.tensor_bytes), c.shard_count, c.shard_count == 1 ? "" : "s");
}

// What a verification covered: the contents, and for a multi-rank
// checkpoint how many ranks' parts ("4 tensors, 792 B in 3 shards, 2 ranks").
std::string DescribeVerified(const Reader& reader) {
  std::string text = DescribeContents(Summarize(reader));
  if (reader.world_size() > 1) absl::StrAppend(&text, ", ", reader.world_size(), " ranks");
  return text;
}

// Which part of a multi-rank checkpoint `reader` shows, for the line under
// --step/--latest's heading: "the whole checkpoint (...)" or "rank 1's part".
std::string DescribePart(const Reader& reader) {
  if (reader.rank() < 0) {
    return "the whole checkpoint (replicated and sharded tensors under their names, every rank's "
           "others as rank<r>/<name>)";
  }
  return absl::StrFormat("rank %d's part (its own tensors, the replicated ones and every sharded one whole)",
                         reader.rank());
}

// The ranks holding a sharded tensor's chunks, as "0-3" when they run
// without a gap, else "0,2,5".
std::string ChunkRanks(const TensorInfo& t) {
  std::vector<int> ranks;
  for (const TensorInfo::Chunk& c : t.chunks) ranks.push_back(c.rank);
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  if (ranks.size() > 1 && ranks.back() - ranks.front() + 1 == static_cast<int>(ranks.size())) {
    return absl::StrCat(ranks.front(), "-", ranks.back());
  }
  return absl::StrJoin(ranks, ",");
}

// Prints one verification result: a table line, or a JSON record.
void PrintVerifyResult(const RestoreRequest& request, int64_t step,
                       const absl::StatusOr<std::unique_ptr<Reader>>& result, Output& output) {
  if (request.json) {
    Json json = {{"step", step}, {"ok", result.ok()}, {"error", nullptr}};
    if (result.ok()) {
      const Contents c = Summarize(**result);
      json["tensor_count"] = c.tensor_count;
      json["tensor_bytes"] = c.tensor_bytes;
      json["shard_count"] = c.shard_count;
      json["world_size"] = (*result)->world_size();
    } else {
      json["error"] = StatusText(result.status());
    }
    output.PrintJson(json);
  } else if (result.ok()) {
    output.out() << absl::StrFormat("step %d: ok (%s)\n", step, DescribeVerified(**result));
  } else {
    output.out() << absl::StrFormat("step %d: FAILED: %s\n", step, StatusText(result.status()));
  }
}

// Finds the newest checkpoint that fully verifies, trying newest first, each
// candidate with a progress bar of its own. Each newer one that fails is
// reported on `err` (and, for --verify, as a result on `out`). On failure
// writes the error and returns its code.
int SelectLatest(const RestoreRequest& request, const std::vector<int64_t>& steps,
                 Output& output, std::unique_ptr<Reader>* chosen) {
  const std::map<int64_t, uint64_t> bytes = TensorBytesByStep(request.root, output.bar());
  NewestFirst walk(steps);
  while (std::optional<int64_t> step = walk.Next()) {
    const uint64_t budget = bytes.count(*step) > 0 ? bytes.at(*step) : 0;
    output.bar().Start(absl::StrFormat("verifying step %d", *step), budget);
    absl::StatusOr<std::unique_ptr<Reader>> reader =
        VerifyStep(request.root, *step, output.bar(), budget);
    if (reader.ok()) output.bar().Finish();
    if (request.action == Action::kVerify) PrintVerifyResult(request, *step, reader, output);
    if (reader.ok()) {
      if (!walk.skipped().empty()) {
        std::vector<int64_t> skipped;
        for (const SkippedCheckpoint& s : walk.skipped()) skipped.push_back(s.step);
        output.Warn(absl::StrFormat(
            "fell back to step %d, the newest checkpoint that verifies (skipped %s)", *step,
            absl::StrJoin(skipped, ", ")));
      }
      *chosen = std::move(*reader);
      return kExitOk;
    }
    output.Warn(absl::StrFormat("skipped step %d: %s", *step, StatusText(reader.status())));
    walk.Skip(*step, reader.status());
  }
  return output.Fail(kExitDataLoss, absl::StrFormat("no checkpoint in %s verifies (tried %s)",
                                                    request.root, DescribeSteps(steps)));
}

// Fails unless `step` is one of `steps`.
int CheckStepExists(const RestoreRequest& request, const std::vector<int64_t>& steps,
                    Output& output) {
  if (std::binary_search(steps.begin(), steps.end(), request.step)) return kExitOk;
  return output.Fail(kExitNotFound,
                     absl::StrFormat("no checkpoint at step %d in %s (it has %s)", request.step,
                                     request.root, DescribeSteps(steps)));
}

int RunVerify(const RestoreRequest& request, const std::vector<int64_t>& steps, Output& output) {
  if (request.selection == Selection::kLatest) {
    std::unique_ptr<Reader> chosen;
    if (int code = SelectLatest(request, steps, output, &chosen); code != kExitOk) return code;
    if (!request.json) {
      output.out() << absl::StrFormat("newest checkpoint that verifies: step %d (%s)\n",
                                      chosen->step(), chosen->dir());
    }
    return kExitOk;
  }
  std::vector<int64_t> targets = steps;
  if (request.selection == Selection::kStep) targets = {request.step};
  // One bar over every target, in tensor bytes.
  const std::map<int64_t, uint64_t> bytes = TensorBytesByStep(request.root, output.bar());
  uint64_t total = 0;
  for (int64_t step : targets) total += bytes.count(step) > 0 ? bytes.at(step) : 0;
  auto label = [&](size_t i) {
    return targets.size() == 1
               ? absl::StrCat("verifying step ", targets[i])
               : absl::StrFormat("verifying step %d (%d of %d)", targets[i], i + 1,
                                 targets.size());
  };
  output.bar().Start(label(0), total);
  std::vector<int64_t> failed;
  for (size_t i = 0; i < targets.size(); ++i) {
    const int64_t step = targets[i];
    output.bar().SetLabel(label(i));
    const uint64_t budget = bytes.count(step) > 0 ? bytes.at(step) : 0;
    absl::StatusOr<std::unique_ptr<Reader>> reader =
        VerifyStep(request.root, step, output.bar(), budget);
    PrintVerifyResult(request, step, reader, output);
    if (!reader.ok()) failed.push_back(step);
  }
  output.bar().Finish();
  if (failed.empty()) return kExitOk;
  return output.Fail(kExitDataLoss,
                     absl::StrFormat("verification failed for %d of %d checkpoint%s: %s",
                                     failed.size(), targets.size(),
                                     targets.size() == 1 ? "" : "s", DescribeSteps(failed)));
}

// Prints a checkpoint's extras and tensors.
void PrintContents(const RestoreRequest& request, const Reader& reader, Output& output) {
  const Contents c = Summarize(reader);
  if (request.json) {
    Json tensors = Json::array();
    for (const TensorInfo& t : reader.tensors()) tensors.push_back(Json::parse(TensorInfoJson(t)));
    Json extras = Json::parse(reader.extras_json(), nullptr, /*allow_exceptions=*/false);
    if (extras.is_discarded()) extras = reader.extras_json();
    output.PrintJson({{"step", reader.step()},
                      {"dir", reader.dir()},
                      {"world_size", reader.world_size()},
                      {"rank", request.rank.has_value() ? Json(*request.rank) : Json(nullptr)},
                      {"verified", request.selection == Selection::kLatest},
                      {"extras", extras},
                      {"tensor_count", c.tensor_count},
                      {"tensor_bytes", c.tensor_bytes},
                      {"shard_count", c.shard_count},
                      {"tensors", tensors}});
    return;
  }
  std::ostream& out = output.out();
  out << absl::StrFormat("step %d  %s\n", reader.step(), reader.dir());
  // A multi-rank checkpoint says which part this is, and where each tensor
  // comes from: its placement and the rank whose part holds it.
  const bool multi_rank = reader.world_size() > 1;
  if (multi_rank) {
    out << absl::StrFormat("ranks: %d; %s\n", reader.world_size(), DescribePart(reader));
  }
  out << "extras: " << reader.extras_json() << "\n";
  std::vector<std::string> header = {"NAME", "DTYPE", "SHAPE", "BYTES"};
  std::vector<bool> right = {false, false, false, true};
  if (multi_rank) {
    header.insert(header.end(), {"PLACEMENT", "RANK"});
    right.insert(right.end(), {false, true});
  }
  header.push_back("SHARD");
  Table table(header, right);
  for (const TensorInfo& t : reader.tensors()) {
    std::vector<std::string> row = {t.name, std::string(DTypeName(t.dtype)), FormatShape(t.shape),
                                    absl::StrCat(t.raw_bytes)};
    if (multi_rank) {
      row.insert(row.end(), {std::string(TensorPlacementName(t.placement)),
                             t.chunks.empty() ? absl::StrCat(t.rank) : ChunkRanks(t)});
    }
    row.push_back(t.chunks.empty() ? t.shard
                                   : absl::StrFormat("%d chunk%s", t.chunks.size(), t.chunks.size() == 1 ? "" : "s"));
    table.AddRow(std::move(row));
  }
  table.Print(out);
  out << DescribeContents(c)
      << (request.selection == Selection::kLatest ? "; every checksum verified\n"
                                                  : "; manifest checked, data not read "
                                                    "(--verify reads it)\n");
}

// "step 7" or, for one rank's part, "step 7, rank 1's part".
std::string WhatIsExported(const RestoreRequest& request, const Reader& reader) {
  return request.rank.has_value() ? absl::StrFormat("step %d, rank %d's part", reader.step(), *request.rank)
                                  : absl::StrFormat("step %d", reader.step());
}

// The exit code of a failed export: what the user asked for wrong is a
// usage error; what the disk did is an error (a full disk included); damage
// is data loss.
int ExportExitCode(const absl::Status& status) {
  const absl::StatusCode c = status.code();
  return c == absl::StatusCode::kDataLoss ? kExitDataLoss
         : c == absl::StatusCode::kInvalidArgument || c == absl::StatusCode::kAlreadyExists
             ? kExitUsage
             : kExitError;
}

// The progress callback of an export to `to`, drawing the bar.
std::function<void(uint64_t, uint64_t)> ExportProgress(Output& output, const std::string& what,
                                                       const std::string& to, uint64_t* shown) {
  return [&output, what, to, shown](uint64_t done, uint64_t total) {
    if (done == 0) output.bar().Start(absl::StrFormat("exporting %s to %s", what, to), total);
    output.bar().Add(done - *shown);
    *shown = done;
  };
}

// Writes `reader`'s checkpoint as a safetensors file (--out), with a bar.
int Export(const RestoreRequest& request, Reader& reader, Output& output) {
  const std::string what = WhatIsExported(request, reader);
  uint64_t shown = 0;
  absl::StatusOr<ExportResult> exported = ExportSafetensors(
      reader, request.export_filter, request.export_path, ExportProgress(output, what, request.export_path, &shown));
  if (!exported.ok()) {
    return output.Fail(ExportExitCode(exported.status()),
                       absl::StrFormat("%s: %s", what, StatusText(exported.status())));
  }
  output.bar().Finish();
  output.out() << absl::StrFormat("wrote %s: %s, %d tensors, %d bytes\n", request.export_path,
                                  what, exported->tensors, exported->bytes);
  return kExitOk;
}

// Writes `reader`'s checkpoint as a Hugging Face model directory
// (--export-hf), with a bar.
int ExportHf(const RestoreRequest& request, Reader& reader, Output& output) {
  const std::string what = WhatIsExported(request, reader);
  uint64_t shown = 0;
  absl::StatusOr<HfExportResult> exported = ExportHuggingFace(
      reader, request.export_hf_dir, request.hf, ExportProgress(output, what, request.export_hf_dir, &shown));
  if (!exported.ok()) {
    return output.Fail(ExportExitCode(exported.status()),
                       absl::StrFormat("%s: %s", what, StatusText(exported.status())));
  }
  output.bar().Finish();
  const size_t copied = request.hf.copy_files.size();
  output.out() << absl::StrFormat("wrote %s: %s, %d tensors in %d safetensors file%s, %d bytes of tensors%s\n",
                                  request.export_hf_dir, what, exported->tensors, exported->shards,
                                  exported->shards == 1 ? "" : "s", exported->tensor_bytes,
                                  copied == 0 ? "" : absl::StrFormat(", %d file%s copied", copied,
                                                                     copied == 1 ? "" : "s"));
  return kExitOk;
}

// Opens what --step/--latest show of checkpoint `step`: rank
// `request.rank`'s part, or the whole checkpoint. A rank it does not have is
// not found (3); a damaged manifest is data loss (1).
int OpenShown(const RestoreRequest& request, int64_t step, Output& output,
              std::unique_ptr<Reader>* reader) {
  absl::StatusOr<std::unique_ptr<Reader>> opened = OpenStep(request.root, step, request.rank);
  if (!opened.ok()) {
    const int code = absl::IsNotFound(opened.status()) ? kExitNotFound : kExitDataLoss;
    return output.Fail(code, absl::StrFormat("step %d: %s", step, StatusText(opened.status())));
  }
  *reader = std::move(*opened);
  return kExitOk;
}

int RunShow(const RestoreRequest& request, const std::vector<int64_t>& steps, Output& output) {
  std::unique_ptr<Reader> reader;
  if (request.selection == Selection::kLatest) {
    // The newest checkpoint whose every part verifies, whichever part is
    // shown: every rank restoring with --latest picks the same step.
    if (int code = SelectLatest(request, steps, output, &reader); code != kExitOk) return code;
    if (request.rank.has_value()) {
      const int64_t step = reader->step();
      if (int code = OpenShown(request, step, output, &reader); code != kExitOk) return code;
    }
  } else {
    if (int code = OpenShown(request, request.step, output, &reader); code != kExitOk) return code;
  }
  if (!request.export_path.empty()) return Export(request, *reader, output);
  if (!request.export_hf_dir.empty()) return ExportHf(request, *reader, output);
  PrintContents(request, *reader, output);
  return kExitOk;
}

}  // namespace

namespace {

// Checks --out, --export-hf and the flags that go with them; puts the
// Hugging Face export's options into `request->hf`.
absl::Status CheckExportFlags(const RestoreFlags& flags, RestoreRequest* request) {
  const bool hf_only = !flags.strip_prefix.empty() || !flags.max_shard_size.empty() || !flags.dtype.empty() ||
                       !flags.copy.empty();
  if (hf_only && flags.export_hf.empty()) {
    return absl::InvalidArgumentError(
        "--strip-prefix, --max-shard-size, --dtype and --copy go with --export-hf DIR");
  }
  if (!flags.out.empty() && !flags.export_hf.empty()) {
    return absl::InvalidArgumentError("--out and --export-hf both export; give one");
  }
  const char* flag = !flags.out.empty() ? "--out" : !flags.export_hf.empty() ? "--export-hf" : nullptr;
  if (flag == nullptr) return absl::OkStatus();
  if (flags.list || flags.verify || flags.all) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " exports one checkpoint; it conflicts with --list, --verify and --all"));
  }
  if (!flags.step.has_value() && !flags.latest) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " needs --step N or --latest"));
  }
  if (flags.export_hf.empty()) return absl::OkStatus();
  request->export_hf_dir = flags.export_hf;
  request->hf.filter = flags.filter;
  request->hf.strip_prefix = flags.strip_prefix;
  request->hf.copy_files = flags.copy;
  if (!flags.max_shard_size.empty()) {
    absl::StatusOr<uint64_t> size = ParseShardSize(flags.max_shard_size);
    if (!size.ok()) return absl::InvalidArgumentError(absl::StrCat("--max-shard-size: ", size.status().message()));
    request->hf.max_shard_bytes = *size;
  }
  if (!flags.dtype.empty()) {
    absl::StatusOr<DType> dtype = DTypeFromName(flags.dtype);
    if (!dtype.ok() || !IsFloatingDType(*dtype)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--dtype must be float16, bfloat16, float32 or float64, got \"", flags.dtype, "\""));
    }
    request->hf.dtype = *dtype;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<RestoreRequest> MakeRequest(const RestoreFlags& flags) {
  if (flags.root.empty()) {
    return absl::InvalidArgumentError("--root DIR is required (the checkpoint root directory)");
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
  if (flags.rank.has_value()) {
    if (*flags.rank < 0 || *flags.rank > std::numeric_limits<int>::max()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--rank must be a rank number >= 0, got %d", *flags.rank));
    }
    if (flags.list || flags.verify || flags.all) {
      return absl::InvalidArgumentError(
          "--rank selects one rank's part to show or export; --list and --verify always cover "
          "every rank's part (drop --rank)");
    }
    if (!flags.step.has_value() && !flags.latest) {
      return absl::InvalidArgumentError("--rank needs --step N or --latest");
    }
  }
  if (!flags.filter.empty() && flags.out.empty() && flags.export_hf.empty()) {
    return absl::InvalidArgumentError(
        "--filter selects tensors for --out or --export-hf; give --out FILE or --export-hf DIR");
  }
  absl::StatusOr<ProgressMode> progress = ParseProgressMode(flags.progress);
  if (!progress.ok()) return progress.status();
  RestoreRequest request;
  if (absl::Status export_flags = CheckExportFlags(flags, &request); !export_flags.ok()) return export_flags;
  request.root = flags.root;
  request.export_path = flags.out;
  request.export_filter = flags.filter;
  if (flags.rank.has_value()) request.rank = static_cast<int>(*flags.rank);
  request.json = flags.json;
  request.progress = *progress;
  // --list --verify lists, with a verification result per checkpoint.
  request.action = flags.list ? Action::kList : flags.verify ? Action::kVerify : Action::kShow;
  request.verify = flags.list && flags.verify;
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
  ProgressBar bar(err, ShowProgress(request.progress), TerminalColumns());
  Output output(out, err, bar);
  std::vector<int64_t> steps;
  if (int code = LoadSteps(request.root, output, &steps); code != kExitOk) return code;
  if (auto rank = RankCopyOf(request.root); rank.ok() && rank->has_value()) {
    return output.Fail(
        kExitNotFound,
        absl::StrCat(DescribeRankCopy(request.root, **rank), ": --root s3://BUCKET/PREFIX"));
  }
  if (request.selection == Selection::kStep) {
    if (int code = CheckStepExists(request, steps, output); code != kExitOk) return code;
  }
  switch (request.action) {
    case Action::kList:
      return RunList(request, output);
    case Action::kVerify:
      return RunVerify(request, steps, output);
    case Action::kShow:
      return RunShow(request, steps, output);
  }
  return output.Fail(kExitError, "internal error: unknown action");
}

}  // namespace ckpt::tools
