// tools/restore/commands.h: the verbs of ckpt-restore, apart from flag parsing.
//
// `MakeRequest` turns the raw flags into one `RestoreRequest` (or a usage
// error); `RunRestore` carries it out, writing results to `out` and every
// diagnostic to `err` as one line prefixed "ckpt-restore: ", and returns the
// process exit code. Long operations (verifying, exporting) draw a progress
// bar on `err` (see progress_bar.h); it is erased before any other line is
// written, so results and diagnostics never share a line with it.
#ifndef CKPT_TOOLS_RESTORE_COMMANDS_H_
#define CKPT_TOOLS_RESTORE_COMMANDS_H_

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ckpt/hf_export.h"
#include "restore/progress_bar.h"

namespace ckpt::tools {

// Exit codes of ckpt-restore. Stable: scripts test them. Documented in
// --help and docs/ckpt-restore.md.
enum ExitCode : int {
  kExitOk = 0,
  // A selected checkpoint failed verification (or could not be read), one
  // that --list --verify lists does not verify, or --latest found no
  // checkpoint that verifies.
  kExitDataLoss = 1,
  // Bad, missing or conflicting flags.
  kExitUsage = 2,
  // ROOT does not exist or is not a directory, holds no committed
  // checkpoint, is one rank's own copy (`RankCopyOf`), or has no checkpoint
  // at --step.
  kExitNotFound = 3,
  // Any other failure (e.g. ROOT cannot be listed: permission denied, EIO).
  kExitError = 4,
};

inline constexpr char kToolName[] = "ckpt-restore";

// What to do with the selected checkpoints.
enum class Action {
  kShow,    // print one checkpoint's tensors and extras
  kList,    // one row per committed checkpoint, from the manifests (and,
            // with `RestoreRequest::verify`, from reading every tensor)
  kVerify,  // read every record, check every checksum
};

// Which checkpoints an action applies to.
enum class Selection {
  kAll,     // every committed checkpoint
  kStep,    // `RestoreRequest::step`
  kLatest,  // the newest checkpoint that fully verifies
};

// The flags as given, before validation.
struct RestoreFlags {
  std::string root;
  bool list = false;
  bool verify = false;
  std::optional<int64_t> step;
  std::optional<int64_t> rank;  // --rank R: one rank's part (show and export)
  bool latest = false;
  bool all = false;
  bool json = false;
  std::string out;     // --out FILE.safetensors
  std::string filter;  // --filter PREFIX (with --out or --export-hf)
  std::string export_hf;     // --export-hf DIR: a Hugging Face model directory
  std::string strip_prefix;  // --strip-prefix PREFIX (with --export-hf)
  std::string max_shard_size;  // --max-shard-size SIZE (with --export-hf; default 50GB)
  std::string dtype;           // --dtype NAME (with --export-hf): floats converted
  std::vector<std::string> copy;  // --copy FILE,... (with --export-hf): copied beside
  std::string progress = "auto";  // --progress=auto|always|never
  std::string import_dcp;  // --import-dcp DCP_DIR (with --step N): see import_dcp.h
};

// A validated request.
struct RestoreRequest {
  std::string root;
  Action action = Action::kShow;
  Selection selection = Selection::kAll;
  int64_t step = -1;  // with `Selection::kStep`
  // With kShow: show or export rank `rank`'s part of the selected checkpoint
  // (its own tensors and the replicated ones, under the names it saved).
  // Unset: the whole checkpoint (replicated tensors under their names, every
  // rank's others as "rank<r>/<name>"). Selecting (--latest) always verifies
  // the whole checkpoint, so every rank picks the same step.
  std::optional<int> rank;
  bool json = false;  // JSON Lines on `out` instead of tables
  bool verify = false;  // with kList: verify every listed checkpoint too
  ProgressMode progress = ProgressMode::kAuto;  // kAuto: when stderr is a terminal
  std::string export_path;    // with kShow: write a safetensors file instead of printing
  std::string export_filter;  // only tensors whose names start with this
  // With kShow: write a Hugging Face model directory instead (`hf` says how;
  // its `filter` is `export_filter`).
  std::string export_hf_dir;
  HfExportOptions hf;
};

// Validates flag combinations: --root is required; --list with --verify
// lists and verifies; --step, --latest and --all exclude each other; --list
// takes no --step/--latest; without an action, --step or --latest is
// required; --rank is >= 0 and goes with --step or --latest alone (not with
// --list or --verify, which cover every rank); --progress is auto, always or
// never. Errors are kInvalidArgument
// with a one-line message.
absl::StatusOr<RestoreRequest> MakeRequest(const RestoreFlags& flags);

// Runs `request`; returns an `ExitCode`. The progress bar, when
// `request.progress` asks for one, is drawn on `err`.
int RunRestore(const RestoreRequest& request, std::ostream& out, std::ostream& err);

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_RESTORE_COMMANDS_H_
