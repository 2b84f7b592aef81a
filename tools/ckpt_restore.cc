// ckpt-restore: lists, verifies, inspects and exports the checkpoints of a
// ckpt root.
//
// This file only parses flags and prints --help; the verbs live in
// restore_commands.{h,cc}. See docs/ckpt-restore.md.
#include <cstdint>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "restore_commands.h"

ABSL_FLAG(std::string, root, "",
          "Checkpoint root directory (the one holding step-* directories and LATEST). "
          "Required; may also be given as the single positional argument.");
ABSL_FLAG(bool, list, false,
          "List every committed checkpoint, oldest first: step, kind (full, or delta of its "
          "base step), exact or lossy (with its error bound), size on disk, tensor count, "
          "shard count, creation time (UTC) and manifest status. Reads manifests only; a "
          "damaged manifest shows as DAMAGED and --list still exits 0. With --verify it also "
          "reads every tensor of every listed checkpoint (deltas through their whole chain) "
          "and adds a VERIFIED column, 'ok' or 'FAILED: <reason>'; it then exits 1 unless "
          "every listed checkpoint verifies.");
ABSL_FLAG(bool, verify, false,
          "Read every record of the selected checkpoints and check every checksum; a delta is "
          "rebuilt through its chain, checking every base it uses (a missing or replaced base "
          "fails it). Selects --all unless --step or --latest is given. Prints one line per "
          "checkpoint ('step N: ok (...)' or 'step N: FAILED: <reason naming the file and "
          "tensor>'); exits 1 if any fails. With --list, adds a VERIFIED column (see --list).");
ABSL_FLAG(std::optional<int64_t>, step, std::nullopt,
          "Select checkpoint N (its step number). Without --verify, print its tensors and "
          "extras (the manifest is checked, the data is not read).");
ABSL_FLAG(bool, latest, false,
          "Select the newest checkpoint that fully verifies (every checksum), trying newest "
          "first. Each newer checkpoint that fails is reported on stderr as 'skipped step N: "
          "<reason>', followed by 'fell back to step M'; a fallback still exits 0. Without "
          "--verify, print the chosen checkpoint's tensors and extras.");
ABSL_FLAG(bool, all, false,
          "With --verify: verify every committed checkpoint (the default when neither --step "
          "nor --latest is given).");
ABSL_FLAG(std::string, out, "",
          "With --step N or --latest: write that checkpoint (deltas resolved, every checksum "
          "verified) as a safetensors file FILE, readable by safetensors' loaders and torch; the "
          "step and the extras go in its __metadata__. FILE must not exist; it appears only "
          "when complete.");
ABSL_FLAG(std::string, filter, "",
          "With --out: export only the tensors whose names start with this prefix.");
ABSL_FLAG(std::string, progress, "auto",
          "Progress bar for verifying and exporting (--verify, --list --verify, --latest, "
          "--out), in bytes of tensors, on stderr, redrawn in place at most 10 times a second: "
          "auto (the default) draws it when stderr is a terminal, always draws it even into a "
          "file or pipe, never turns it off. It never goes to stdout.");
ABSL_FLAG(bool, json, false,
          "Print JSON Lines on stdout (one JSON object per line) instead of tables. --list: "
          "one object per checkpoint with step, kind, base_step, compacted, exact, error_bound, "
          "file_bytes, tensor_bytes, tensor_count, shard_count, created_unix_ns, ok (manifest "
          "checks pass), error (null when ok), latest, dir; with --verify also verified "
          "(true/false), and error then says why it does not verify. --verify: one "
          "object per checkpoint tried with step, ok, error and, when ok, tensor_count, "
          "tensor_bytes, shard_count. --step/--latest: one object with step, dir, verified, "
          "extras, tensor_count, tensor_bytes, shard_count and tensors (name, dtype, shape, "
          "raw_bytes, stored_bytes, encoding, shard, offset, xxh3). Diagnostics stay on stderr "
          "as text.");

namespace {

using ckpt::tools::kExitUsage;
using ckpt::tools::kToolName;

// The flags --help describes, in the order it describes them, with the name
// of their value ("" for a boolean).
struct HelpFlag {
  absl::string_view name;
  absl::string_view value;
};
constexpr HelpFlag kHelpFlags[] = {{"root", "DIR"},   {"list", ""},        {"verify", ""},
                                   {"step", "N"},      {"latest", ""},      {"all", ""},
                                   {"json", ""},       {"out", "FILE"},     {"filter", "PREFIX"},
                                   {"progress", "WHEN"}};

constexpr char kSynopsis[] =
    R"(ckpt-restore: list, verify, inspect and export the checkpoints of a ckpt root.

Usage:
  ckpt-restore --root DIR --list [--verify] [--json]
  ckpt-restore --root DIR --verify [--all | --step N | --latest] [--json]
  ckpt-restore --root DIR (--step N | --latest) [--json]
  ckpt-restore --root DIR (--step N | --latest) --out FILE.safetensors [--filter PREFIX]
Every form takes --progress=auto|always|never.
)";

constexpr char kTrailer[] = R"(
Exit codes:
  0  success (also when --latest skipped damaged newer checkpoints and fell
     back to an older one: the skips are reported on stderr)
  1  data loss: a selected checkpoint failed verification or could not be
     read, --list --verify listed one that does not verify, --out read a
     damaged tensor, or --latest found no checkpoint that verifies
  2  usage error: unknown, missing, malformed or conflicting flags
  3  not found: ROOT does not exist or is not a directory, holds no committed
     checkpoint, or has no checkpoint at --step N
  4  other error (e.g. ROOT cannot be listed)

Every diagnostic is one line on stderr starting with "ckpt-restore: ".

Examples:
  ckpt-restore --root /ckpt/run1 --list
  ckpt-restore --root /ckpt/run1 --list --verify       # ... and does each one verify?
  ckpt-restore --root /ckpt/run1 --latest --verify     # what would a restart load?
  ckpt-restore --root /ckpt/run1 --verify --all        # audit every checkpoint
  ckpt-restore --root /ckpt/run1 --step 1200           # tensors and extras of 1200
  ckpt-restore --root /ckpt/run1 --list --json | jq 'select(.ok | not)'
  ckpt-restore --root /ckpt/run1 --latest --out model.safetensors --filter model.

See docs/ckpt-restore.md for incident recovery.
)";

// Appends `text` to `out` wrapped at `width` columns, every line indented.
void AppendWrapped(absl::string_view text, size_t indent, size_t width, std::string* out) {
  const std::string pad(indent, ' ');
  std::string line;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (!line.empty() && pad.size() + line.size() + 1 + word.size() > width) {
      absl::StrAppendFormat(out, "%s%s\n", pad, line);
      line.clear();
    }
    if (!line.empty()) line += ' ';
    line.append(word.data(), word.size());
  }
  if (!line.empty()) absl::StrAppendFormat(out, "%s%s\n", pad, line);
}

std::string HelpText() {
  std::string text = kSynopsis;
  text += "\nFlags:\n";
  for (const HelpFlag& help : kHelpFlags) {
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(help.name);
    if (flag == nullptr) continue;
    absl::StrAppendFormat(&text, "  --%s%s%s\n", help.name, help.value.empty() ? "" : " ",
                          help.value);
    AppendWrapped(flag->Help(), 6, 80, &text);
  }
  text += "  --help\n      Print this text and exit 0.\n";
  text += kTrailer;
  return text;
}

bool WantsHelp(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--") return false;
    if (arg == "-h" || arg == "--help" || arg == "-help" || arg == "--helpfull" ||
        arg == "--helpshort") {
      return true;
    }
  }
  return false;
}

// `absl::ParseCommandLine` exits with status 1 on a bad flag, but ckpt-restore
// promises 2 for usage errors and 1 for data loss. So every flag is first
// checked here, the way absl parses it (--name=value, --name value, --name and
// --noname for booleans, "--" ends flags); the message of the first problem
// is returned. absl then parses the same arguments again, without error.
std::optional<std::string> CheckFlags(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (arg.size() < 2 || arg[0] != '-') continue;  // a positional argument
    arg.remove_prefix(arg[1] == '-' ? 2 : 1);
    absl::string_view name = arg;
    absl::string_view value;
    const size_t eq = arg.find('=');
    const bool has_value = eq != absl::string_view::npos;
    if (has_value) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
    }
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    bool negated = false;
    if (flag == nullptr && absl::StartsWith(name, "no")) {
      flag = absl::FindCommandLineFlag(name.substr(2));
      negated = flag != nullptr && flag->IsOfType<bool>();
      if (!negated) flag = nullptr;
    }
    if (flag == nullptr) return absl::StrFormat("unknown flag --%s (see --help)", name);
    if (flag->IsOfType<bool>()) {
      if (negated && has_value) return absl::StrFormat("--%s takes no value", name);
      if (!has_value) continue;
    } else if (!has_value) {
      if (i + 1 >= argc) return absl::StrFormat("--%s needs a value", name);
      value = argv[++i];
    }
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      return absl::StrFormat("bad value '%s' for --%s: %s", value, name, error);
    }
  }
  return std::nullopt;
}

int Usage(absl::string_view message) {
  std::cerr << kToolName << ": " << message << "\n";
  return kExitUsage;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "lists, verifies, inspects and exports ckpt checkpoints; see --help");
  if (WantsHelp(argc, argv)) {
    std::cout << HelpText();
    return 0;
  }
  if (std::optional<std::string> problem = CheckFlags(argc, argv)) return Usage(*problem);
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);

  ckpt::tools::RestoreFlags flags;
  flags.root = absl::GetFlag(FLAGS_root);
  flags.list = absl::GetFlag(FLAGS_list);
  flags.verify = absl::GetFlag(FLAGS_verify);
  flags.step = absl::GetFlag(FLAGS_step);
  flags.latest = absl::GetFlag(FLAGS_latest);
  flags.all = absl::GetFlag(FLAGS_all);
  flags.json = absl::GetFlag(FLAGS_json);
  flags.out = absl::GetFlag(FLAGS_out);
  flags.filter = absl::GetFlag(FLAGS_filter);
  flags.progress = absl::GetFlag(FLAGS_progress);
  if (positional.size() > 2) {
    return Usage(absl::StrFormat("unexpected argument '%s' (only one ROOT may be given)",
                                 positional[2]));
  }
  if (positional.size() == 2) {
    if (!flags.root.empty() && flags.root != positional[1]) {
      return Usage(absl::StrFormat("ROOT given twice: --root %s and '%s'", flags.root,
                                   positional[1]));
    }
    flags.root = positional[1];
  }

  absl::StatusOr<ckpt::tools::RestoreRequest> request = ckpt::tools::MakeRequest(flags);
  if (!request.ok()) return Usage(absl::StrCat(request.status().message(), " (see --help)"));
  return ckpt::tools::RunRestore(*request, std::cout, std::cerr);
}
