// tools/retain/cli.cc: the command line of ckpt-retain (see cli.h).
#include "retain/cli.h"

#include "ckpt/log.h"
#include "ckpt/maintenance.h"

#include <stdlib.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/cli_flags.h"
#include "nlohmann/json.hpp"
#include "retain/retention.h"

namespace ckpt::tools {
namespace {

constexpr char kSynopsis[] =
    R"(ckpt-retain: retention and tiering of a ckpt checkpoint root, for cron.

Usage:
  ckpt-retain --root DIR [--keep-last N] [--keep-every K] [--keep-newer-than D]
              [--cold-dir DIR] [--stale-temp-age D] [--compact=false]
              [--dry-run] [--json]
At least one --keep-* rule is required. Always kept: the newest checkpoint and
the one LATEST names, with their whole delta chains; a kept delta is compacted
into a full checkpoint, or keeps its bases. A value may follow its flag
(--keep-last 5) or be joined with '=' (--keep-last=5); underscores may stand
for dashes (--keep_last). Durations: 24h, 90m, 1h30m, 45s.
)";

constexpr char kTrailer[] = R"(
Exit codes:
  0  done
  1  some action failed (the others still ran)
  2  usage error: an unknown, missing or malformed flag, no --keep-* rule, a
     cold dir equal to, inside or around ROOT, ROOT not a checkpoint root
  3  ROOT or the cold dir is missing
  4  another ckpt-retain is running on ROOT (or holds the s3:// cold tier's
     lease, as does a training job's upload behind the save while it
     uploads a step), its lock file cannot be used, or another error

Every diagnostic is one line on stderr starting with "ckpt-retain: ".

Examples:
  ckpt-retain --root /ckpt/run1 --keep-last 5 --dry-run
  ckpt-retain --root /ckpt/run1 --keep-last 5 --keep-every 10000 --cold-dir /mnt/cold/run1 --json
  ckpt-retain --root /ckpt/run1 --keep-last 5 --cold-dir s3://my-bucket/run1

See docs/retention.md.
)";

struct RetainFlags {
  std::string root;
  RetentionPolicy policy;
  bool json = false;
};

// The flags of ckpt-retain, bound to `flags`, in the order --help lists them.
FlagSet MakeFlagSet(RetainFlags* flags) {
  RetentionPolicy& policy = flags->policy;
  FlagSet set;
  set.Add("root", "DIR", &flags->root,
          "Checkpoint root directory (required), or an s3://BUCKET/PREFIX the s3:// cold tier "
          "filled: the same rules over the steps committed there, without compaction.");
  set.Add("keep-last", "N", &policy.keep_last, "Keep the newest N checkpoints.");
  set.Add("keep-every", "K", &policy.keep_every,
          "Keep every checkpoint whose step is a multiple of K.");
  set.Add("keep-newer-than", "D", &policy.keep_newer_than,
          "Keep checkpoints created within D (e.g. 24h, 90m).");
  set.Add("cold-dir", "DIR|s3://BUCKET/PREFIX", &policy.cold_dir,
          "Move checkpoints no rule keeps to DIR (another file system is fine) instead of "
          "deleting them: copy, fsync, verify, rename, fsync, then remove the hot copy. Or to a "
          "bucket (S3, MinIO, Ceph, R2, GCS XML; credentials and endpoint from AWS_* and "
          "~/.aws): upload, check (the store's ETags, else a read-back), write the step's "
          "commit marker, then remove the hot copy (docs/object-storage.md).");
  set.Add("upload-streams", "N", &policy.upload_streams,
          "s3:// cold tier: requests in flight at once (default 8).");
  set.Add("upload-part-size", "BYTES", &policy.upload_part_bytes,
          "s3:// cold tier: multipart part size and read-back GET size (default 8388608).");
  set.AddBool("upload-read-back", &policy.upload_read_back,
              "s3:// cold tier: read every object back after uploading it. Off by default: only "
              "objects whose ETags are not the MD5 of the bytes sent are read back (a store "
              "using SSE-KMS or SSE-C gets all of them read back anyway).");
  set.Add("upload-storage-class", "CLASS", &policy.upload_storage_class,
          "s3:// cold tier: the storage class of the checkpoints' objects (STANDARD_IA, "
          "ONEZONE_IA, INTELLIGENT_TIERING, GLACIER_IR, or a class of another store; default: "
          "the bucket's). Commit markers stay in the default class. GLACIER and DEEP_ARCHIVE "
          "are refused: their objects cannot be read without a restore request.");
  set.Add("max-upload-rate", "BYTES", &policy.max_upload_bytes_per_second,
          "s3:// cold tier: the most each upload stream sends per second, to spare the "
          "training job's network (default 0: unlimited).");
  set.Add("lease-wait", "D", &policy.lease_wait,
          "s3:// cold tier or root: while another job holds the prefix's lease (another "
          "ckpt-retain, or a training job's upload behind the save, which holds it while it "
          "uploads a step), wait up to D for it (e.g. 15m) instead of exiting with code 4 at "
          "once (default 0).");
  set.Add("stale-temp-age", "D", &policy.stale_temp_age,
          "While a writer holds ROOT's lock, still remove its .tmp-step-* saves untouched for D "
          "(a hung writer; default 1h). Other orphans (.trash-*, compaction and copy temps, "
          "stale O_DIRECT probes; saves when no writer is alive) go whatever their age.");
  set.AddBool("compact", &policy.compact,
              "On by default: rewrite a kept delta as a full checkpoint when that frees more "
              "bytes than it writes, so that its bases can go; and write a delta that moves to "
              "--cold-dir while its base stays as a full checkpoint there. --compact=false (or "
              "--no-compact): kept deltas keep every base, and a delta whose base stays "
              "stays too.");
  set.AddBool("dry-run", &policy.dry_run, "Print the plan, compactions included; change nothing.");
  set.AddBool("json", &flags->json,
              "Print one JSON object per action (action, name, step, reason, dry_run, done, "
              "bytes, error) instead of text; library log lines on stderr are limited to warnings.");
  return set;
}

// Exit code for a failed `RunRetention`.
int ExitCodeOf(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kNotFound:
      return kRetainNotFound;
    case absl::StatusCode::kInvalidArgument:  // e.g. ROOT is not a checkpoint root
      return kRetainUsage;
    default:
      return kRetainError;
  }
}

void Print(const RetentionAction& a, bool dry_run, bool json, std::ostream& out) {
  if (json) {
    nlohmann::json j = {{"action", ActionName(a.kind)}, {"name", a.name},
                        {"reason", a.reason},           {"dry_run", dry_run},
                        {"done", a.done}};
    if (a.step >= 0) j["step"] = a.step;
    if (a.kind == RetentionAction::Kind::kRemoveStale) j["bytes"] = a.bytes;
    if (!a.error.empty()) j["error"] = a.error;
    out << j.dump() << "\n";
  } else {
    const std::string size =
        a.kind == RetentionAction::Kind::kRemoveStale ? absl::StrCat("; ", HumanBytes(a.bytes)) : "";
    out << (dry_run ? "would " : "") << ActionName(a.kind) << " " << a.name << " (" << a.reason
        << size << ")" << (a.error.empty() ? "" : absl::StrCat(": FAILED: ", a.error)) << "\n";
  }
}

}  // namespace

int RetainMain(int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
  auto fail = [&err](int code, absl::string_view message) {
    err << "ckpt-retain: " << message << std::endl;
    return code;
  };
  RetainFlags flags;
  const FlagSet flag_set = MakeFlagSet(&flags);
  if (WantsHelp(argc, argv)) {
    out << kSynopsis << "\nFlags:\n" << flag_set.Help() << kTrailer;
    return kRetainOk;
  }
  absl::StatusOr<std::vector<std::string>> positional = flag_set.Parse(argc, argv);
  if (!positional.ok()) return fail(kRetainUsage, positional.status().message());
  if (!positional->empty()) {
    return fail(kRetainUsage,
                absl::StrFormat("unexpected argument '%s' (give ROOT as --root DIR; see --help)",
                                positional->front()));
  }
  const RetentionPolicy& policy = flags.policy;
  // The library logs each compaction's I/O choices at info level to stderr;
  // keep that out of JSON output that cron may append stderr to.
  if (flags.json && !LogThresholdFromEnvironment()) SetLogThreshold(LogSeverity::kWarning);
  if (flags.root.empty()) return fail(kRetainUsage, "--root DIR is required (see --help)");
  if (policy.keep_last < 0 || policy.keep_every < 0 ||
      policy.keep_newer_than < absl::ZeroDuration()) {
    return fail(kRetainUsage,
                "--keep-last, --keep-every and --keep-newer-than must not be negative "
                "(see --help)");
  }
  if (policy.upload_streams < 1 || policy.upload_part_bytes < (uint64_t{5} << 20) ||
      policy.max_upload_bytes_per_second < 0) {
    return fail(kRetainUsage,
                "--upload-streams must be >= 1, --upload-part-size >= 5242880 (S3's smallest "
                "part) and --max-upload-rate >= 0 (see --help)");
  }
  if (policy.lease_wait < absl::ZeroDuration()) {
    return fail(kRetainUsage, "--lease-wait must not be negative (see --help)");
  }
  if (absl::Status s = CheckStorageClass(policy.upload_storage_class); !s.ok()) {
    return fail(kRetainUsage, absl::StrCat("--upload-storage-class: ", s.message()));
  }
  if (policy.keep_last == 0 && policy.keep_every == 0 &&
      policy.keep_newer_than == absl::ZeroDuration()) {
    return fail(kRetainUsage,
                "give at least one of --keep-last, --keep-every, --keep-newer-than "
                "(refusing to remove every checkpoint but the newest; see --help)");
  }
  absl::StatusOr<std::vector<RetentionAction>> actions = RunRetention(flags.root, policy);
  if (!actions.ok()) {
    return fail(ExitCodeOf(actions.status()), actions.status().message());
  }
  int failed = 0;
  for (const RetentionAction& a : *actions) {
    if (!a.error.empty()) ++failed;
    Print(a, policy.dry_run, flags.json, out);
  }
  return failed == 0 ? kRetainOk : kRetainActionFailed;
}

}  // namespace ckpt::tools
