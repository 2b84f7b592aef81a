#!/usr/bin/env bash
# Builds nothing: runs each fuzz target of BUILD_DIR for SECONDS, starting
# from the seed corpus (fuzz_seeds, fuzz_catalog_seeds) plus whatever
# earlier runs added under BUILD_DIR/corpus. A crash, leak, sanitizer
# report or timeout fails the run, with the reproducer written to
# BUILD_DIR/artifacts/<target>/.
#   run.sh BUILD_DIR [SECONDS]
set -euo pipefail
build=$1
seconds=${2:-20}
mkdir -p "$build/corpus" "$build/artifacts"
"$build/fuzz_seeds" "$build/corpus"
"$build/fuzz_catalog_seeds" "$build/corpus"
# Each target's outcome is appended to $CKPT_FUZZ_RESULTS when set
# (tools/test.sh counts them); the run fails when any target failed.
record() { [[ -n ${CKPT_FUZZ_RESULTS:-} ]] && printf '%s\t%s\t%s\n' "$1" "$2" "${3:-}" >>"$CKPT_FUZZ_RESULTS"; return 0; }
failed=0
findings='^(#[0-9]+[[:space:]]+DONE|Done|stat::number_of_executed_units|==[0-9]+== ?ERROR|SUMMARY|.*runtime error|.*property violated)'
# Every input a fuzzer (or a person) once found failing must pass for good.
here=$(cd "$(dirname "$0")" && pwd)
for dir in "$here"/regressions/*/; do
  t=$(basename "$dir")
  inputs=$(find "$dir" -type f ! -name '*.md' | sort)
  [ -n "$inputs" ] || continue
  echo "== $t: $(echo "$inputs" | wc -l) regression inputs"
  log="$build/artifacts/$t.regressions.log"
  # shellcheck disable=SC2086
  if ASAN_OPTIONS="detect_leaks=1" "$build/$t" -rss_limit_mb=2048 $inputs >"$log" 2>&1 &&
     ! grep -qE "ERROR|SUMMARY|runtime error|property violated" "$log"; then
    record "fuzz regressions: $t" passed
  else
    grep -E "ERROR|SUMMARY|runtime error|property violated" "$log" | head -20
    echo "$t: a regression input fails again (log: $log)" >&2
    record "fuzz regressions: $t" failed "a regression input fails again"
    failed=1
  fi
done
for t in fuzz_manifest fuzz_delta fuzz_names fuzz_catalog fuzz_safetensors; do
  mkdir -p "$build/artifacts/$t"
  echo "== $t: ${seconds} s"
  log="$build/artifacts/$t.log"
  rc=0
  ASAN_OPTIONS="detect_leaks=1" "$build/$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$build/artifacts/$t/" "$build/corpus/$t" >"$log" 2>&1 || rc=$?
  grep -E "$findings" "$log" | tail -20
  if ((rc != 0)) || ls "$build/artifacts/$t"/* >/dev/null 2>&1; then
    echo "$t: FAILED (exit $rc; inputs kept: $(ls "$build/artifacts/$t" 2>/dev/null | tr '\n' ' '); log: $log)" >&2
    record "fuzz: $t" failed "exit $rc"
    failed=1
  else
    record "fuzz: $t" passed
  fi
done
exit $failed
