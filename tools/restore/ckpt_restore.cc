// ckpt-restore: lists, verifies, inspects and exports the checkpoints of a
// ckpt root.
//
// This file only parses flags and prints --help; the verbs live in
// commands.{h,cc}. See docs/ckpt-restore.md.
#include <iostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "common/cli_flags.h"
#include "restore/commands.h"
#include "restore/import_dcp.h"

namespace {

using ckpt::tools::kExitUsage;
using ckpt::tools::kToolName;

constexpr char kSynopsis[] =
    R"(ckpt-restore: list, verify, inspect and export the checkpoints of a ckpt root.

Usage:
  ckpt-restore --root DIR --list [--verify] [--json]
  ckpt-restore --root DIR --verify [--all | --step N | --latest] [--json]
  ckpt-restore --root DIR (--step N | --latest) [--rank R] [--json]
  ckpt-restore --root DIR (--step N | --latest) [--rank R] --out FILE.safetensors [--filter PREFIX]
  ckpt-restore --root DIR (--step N | --latest) [--rank R] --export-hf DIR [--strip-prefix PREFIX]
               [--filter PREFIX] [--max-shard-size SIZE] [--dtype NAME] [--copy FILE,...]
  ckpt-restore --root DIR --import-dcp DCP_DIR --step N
Every form takes --progress=auto|always|never. ROOT may also be given as the
one positional argument. A flag's value may follow it (--step 5) or be joined
with '=' (--step=5).

A multi-rank checkpoint is one unit: --list, --verify and --latest cover
every rank's part; --step/--latest show and --out exports the whole of it
(replicated tensors under their names, every rank's others as rank<r>/<name>)
unless --rank R picks one rank's part.
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
     checkpoint, is one rank's own copy of checkpoints whose ranks share no
     file system (whole only in the bucket), or has no checkpoint at --step N
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
  ckpt-restore --root /ckpt/run1 --latest --rank 1 --out rank1.safetensors
  ckpt-restore --root /ckpt/run1 --latest --export-hf hf-model --strip-prefix model. \
               --max-shard-size 2GB --dtype bfloat16 --copy config.json,tokenizer.json

See docs/ckpt-restore.md for incident recovery.
)";

// The flags of ckpt-restore, bound to `flags`, in the order --help lists them.
ckpt::tools::FlagSet MakeFlagSet(ckpt::tools::RestoreFlags* flags) {
  ckpt::tools::FlagSet set;
  set.Add("root", "DIR", &flags->root,
          "Checkpoint root directory (the one holding step-* directories and LATEST). "
          "Required; may also be given as the single positional argument.");
  set.AddBool("list", &flags->list,
          "List every committed checkpoint, oldest first: step, kind (full, or delta of its "
          "base step), ranks (how many processes wrote it; 1 for one), exact or lossy (with its error bound), size on disk, tensor count, "
          "shard count, creation time (UTC) and manifest status. Reads manifests only; a "
          "damaged manifest shows as DAMAGED and --list still exits 0. With --verify it also "
          "reads every tensor of every listed checkpoint (deltas through their whole chain) "
          "and adds a VERIFIED column, 'ok' or 'FAILED: <reason>'; it then exits 1 unless "
          "every listed checkpoint verifies.");
  set.AddBool("verify", &flags->verify,
          "Read every record of the selected checkpoints and check every checksum; a delta is "
          "rebuilt through its chain, checking every base it uses (a missing or replaced base "
          "fails it). Selects --all unless --step or --latest is given. Prints one line per "
          "checkpoint ('step N: ok (...)' or 'step N: FAILED: <reason naming the file and "
          "tensor>'); exits 1 if any fails. A multi-rank checkpoint is verified whole: every "
          "rank's part, and damage names the rank's file. With --list, adds a VERIFIED column "
          "(see --list).");
  set.Add("step", "N", &flags->step,
          "Select checkpoint N (its step number). Without --verify, print its tensors and "
          "extras (the manifest is checked, the data is not read).");
  set.AddBool("latest", &flags->latest,
          "Select the newest checkpoint that fully verifies (every checksum), trying newest "
          "first. Each newer checkpoint that fails is reported on stderr as 'skipped step N: "
          "<reason>', followed by 'fell back to step M'; a fallback still exits 0. Without "
          "--verify, print the chosen checkpoint's tensors and extras.");
  set.AddBool("all", &flags->all,
          "With --verify: verify every committed checkpoint (the default when neither --step "
          "nor --latest is given).");
  set.Add("rank", "R", &flags->rank,
          "With --step N or --latest (and --out): show or export only rank R's part of a "
          "multi-rank checkpoint, its own tensors and the replicated ones, under the names it "
          "saved. Without it, the whole checkpoint: replicated tensors under their names, "
          "every rank's others as rank<r>/<name>. --latest still picks the newest checkpoint "
          "whose every part verifies. A single-process checkpoint has rank 0 alone; a rank the "
          "checkpoint does not have exits 3.");
  set.AddBool("json", &flags->json,
          "Print JSON Lines on stdout (one JSON object per line) instead of tables. --list: "
          "one object per checkpoint with step, kind, base_step, compacted, world_size, exact, "
          "error_bound, file_bytes, tensor_bytes, tensor_count, shard_count, created_unix_ns, ok (manifest "
          "checks pass), error (null when ok), latest, dir; with --verify also verified "
          "(true/false), and error then says why it does not verify. --verify: one "
          "object per checkpoint tried with step, ok, error and, when ok, tensor_count, "
          "tensor_bytes, shard_count, world_size. --step/--latest: one object with step, dir, "
          "world_size, rank (null: the whole checkpoint), verified, extras, tensor_count, "
          "tensor_bytes, shard_count and tensors (name, dtype, shape, raw_bytes, stored_bytes, "
          "encoding, shard, offset, xxh3; placement and rank in a multi-rank one). Diagnostics stay on stderr "
          "as text.");
  set.Add("out", "FILE", &flags->out,
          "With --step N or --latest: write that checkpoint (deltas resolved, every checksum "
          "verified) as a safetensors file FILE, readable by safetensors' loaders and torch; the "
          "step and the extras go in its __metadata__. FILE must not exist; it appears only "
          "when complete.");
  set.Add("filter", "PREFIX", &flags->filter,
          "With --out or --export-hf: export only the tensors whose names start with this prefix (the names "
          "as --step shows them: in a whole multi-rank checkpoint, --filter rank1/ keeps rank "
          "1's own tensors).");
  set.Add("export-hf", "DIR", &flags->export_hf,
          "With --step N or --latest: write that checkpoint (deltas resolved, every checksum "
          "verified) as a Hugging Face model directory DIR, what from_pretrained and the "
          "safetensors library read: model.safetensors, or model-0000K-of-0000N.safetensors "
          "files and model.safetensors.index.json. Tied weights are written once (they are one "
          "tensor in the checkpoint). DIR must not exist; it appears only when complete.");
  set.Add("strip-prefix", "PREFIX", &flags->strip_prefix,
          "With --export-hf: export only the tensors whose names start with PREFIX, named "
          "without it (--strip-prefix model. for a state saved as {\"model\": model}).");
  set.Add("max-shard-size", "SIZE", &flags->max_shard_size,
          "With --export-hf: the most tensor bytes per safetensors file, as transformers' "
          "max_shard_size: bytes, or a number with KB, MB, GB (powers of 1000) or KiB, MiB, GiB "
          "(default 50GB, transformers 5's default). A larger tensor gets a file of its own.");
  set.Add("dtype", "NAME", &flags->dtype,
          "With --export-hf: write floating tensors as float16, bfloat16, float32 or float64, "
          "rounded as torch's Tensor.to (default: as saved). Other tensors stay as saved.");
  set.Add("copy", "FILE,...", &flags->copy,
          "With --export-hf: copy these files (config.json, tokenizer files) into DIR under "
          "their base names.");
  set.Add("progress", "WHEN", &flags->progress,
          "Progress bar for verifying and exporting (--verify, --list --verify, --latest, "
          "--out), in bytes of tensors, on stderr, redrawn in place at most 10 times a second: "
          "auto (the default) draws it when stderr is a terminal, always draws it even into a "
          "file or pipe, never turns it off. It never goes to stdout.");
  set.Add("import-dcp", "DCP_DIR", &flags->import_dcp,
          "With --step N: convert DCP_DIR, a checkpoint written by torch.distributed.checkpoint's "
          "FileSystemWriter (any number of ranks), into checkpoint N of --root, streamed and "
          "verified; it then loads with dcp.load through ckpt.dcp.StorageReader. Runs "
          "$CKPT_PYTHON -m ckpt.dcp import (python3 by default). An incomplete DCP_DIR, or a "
          ".metadata that is not plain DCP metadata, exits 1 and writes nothing. See "
          "docs/integrations.md.");
  return set;
}

int Usage(absl::string_view message) {
  std::cerr << kToolName << ": " << message << "\n";
  return kExitUsage;
}

}  // namespace

int main(int argc, char** argv) {
  ckpt::tools::RestoreFlags flags;
  const ckpt::tools::FlagSet flag_set = MakeFlagSet(&flags);
  if (ckpt::tools::WantsHelp(argc, argv)) {
    std::cout << kSynopsis << "\nFlags:\n" << flag_set.Help() << kTrailer;
    return 0;
  }
  absl::StatusOr<std::vector<std::string>> positional = flag_set.Parse(argc, argv);
  if (!positional.ok()) return Usage(positional.status().message());
  if (positional->size() > 1) {
    return Usage(absl::StrFormat("unexpected argument '%s' (only one ROOT may be given; see --help)",
                                 (*positional)[1]));
  }
  if (positional->size() == 1) {
    const std::string& root = positional->front();
    if (!flags.root.empty() && flags.root != root) {
      return Usage(absl::StrFormat("ROOT given twice: --root %s and '%s' (see --help)", flags.root, root));
    }
    flags.root = root;
  }

  if (!flags.import_dcp.empty()) {
    if (flags.root.empty() || !flags.step.has_value() || *flags.step < 0) {
      return Usage("--import-dcp needs --root DIR and --step N (see --help)");
    }
    return ckpt::tools::RunImportDcp(flags.root, flags.import_dcp, *flags.step, std::cerr);
  }
  absl::StatusOr<ckpt::tools::RestoreRequest> request = ckpt::tools::MakeRequest(flags);
  if (!request.ok()) return Usage(absl::StrCat(request.status().message(), " (see --help)"));
  return ckpt::tools::RunRestore(*request, std::cout, std::cerr);
}
