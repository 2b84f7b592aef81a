// tools/restore_commands.h: the verbs of ckpt-restore, apart from flag parsing.
//
// `MakeRequest` turns the raw flags into one `RestoreRequest` (or a usage
// error); `RunRestore` carries it out, writing results to `out` and every
// diagnostic to `err` as one line prefixed "ckpt-restore: ", and returns the
// process exit code. New verbs (writing safetensors, resolving delta chains)
// add an `Action` and a field or two; the selection logic is shared.
#ifndef CKPT_TOOLS_RESTORE_COMMANDS_H_
#define CKPT_TOOLS_RESTORE_COMMANDS_H_

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>

#include "absl/status/statusor.h"

namespace ckpt::tools {

// Exit codes of ckpt-restore. Stable: scripts test them. Documented in
// --help and docs/ckpt-restore.md.
enum ExitCode : int {
  kExitOk = 0,
  // A selected checkpoint failed verification (or could not be read), or
  // --latest found no checkpoint that verifies.
  kExitDataLoss = 1,
  // Bad, missing or conflicting flags.
  kExitUsage = 2,
  // ROOT does not exist or is not a directory, holds no committed
  // checkpoint, or has no checkpoint at --step.
  kExitNotFound = 3,
  // Any other failure (e.g. ROOT cannot be listed: permission denied, EIO).
  kExitError = 4,
};

inline constexpr char kToolName[] = "ckpt-restore";

// What to do with the selected checkpoints.
enum class Action {
  kShow,    // print one checkpoint's tensors and extras
  kList,    // one row per committed checkpoint, from the manifests
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
  bool latest = false;
  bool all = false;
  bool json = false;
  std::string out;     // --out FILE.safetensors
  std::string filter;  // --filter PREFIX (with --out)
};

// A validated request.
struct RestoreRequest {
  std::string root;
  Action action = Action::kShow;
  Selection selection = Selection::kAll;
  int64_t step = -1;  // with `Selection::kStep`
  bool json = false;  // JSON Lines on `out` instead of tables
  std::string export_path;    // with kShow: write a safetensors file instead of printing
  std::string export_filter;  // only tensors whose names start with this
};

// Validates flag combinations: --root is required; --list and --verify
// exclude each other; --step, --latest and --all exclude each other; --list
// takes no --step/--latest; without an action, --step or --latest is
// required. Errors are kInvalidArgument with a one-line message.
absl::StatusOr<RestoreRequest> MakeRequest(const RestoreFlags& flags);

// Runs `request`; returns an `ExitCode`.
int RunRestore(const RestoreRequest& request, std::ostream& out, std::ostream& err);

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_RESTORE_COMMANDS_H_
