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
# Every input a fuzzer (or a person) once found failing must pass for good.
here=$(cd "$(dirname "$0")" && pwd)
for dir in "$here"/regressions/*/; do
  t=$(basename "$dir")
  inputs=$(find "$dir" -type f ! -name '*.md' | sort)
  [ -n "$inputs" ] || continue
  echo "== $t: $(echo "$inputs" | wc -l) regression inputs"
  # shellcheck disable=SC2086
  ASAN_OPTIONS="detect_leaks=1" "$build/$t" -rss_limit_mb=2048 $inputs 2>&1 | grep -E "ERROR|SUMMARY|runtime error|property violated" && exit 1
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "$t: a regression input fails again" >&2; exit 1; }
done
for t in fuzz_manifest fuzz_delta fuzz_names fuzz_catalog fuzz_safetensors; do
  mkdir -p "$build/artifacts/$t"
  echo "== $t: ${seconds} s"
  ASAN_OPTIONS="detect_leaks=1" "$build/$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$build/artifacts/$t/" "$build/corpus/$t" 2>&1 |
    grep -E "^(#[0-9]+[[:space:]]+DONE|Done|stat::number_of_executed_units|==[0-9]+== ?ERROR|SUMMARY|.*runtime error|.*property violated)" || true
  if ls "$build/artifacts/$t"/* >/dev/null 2>&1; then
    echo "$t: found a failing input: $(ls "$build/artifacts/$t")" >&2
    exit 1
  fi
done
