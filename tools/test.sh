#!/usr/bin/env bash
# The README's test commands, in two tiers (docs/reliability.md lists what
# each covers):
#
#   bash tools/test.sh          quick: installs what is missing (its own
#                               stage), builds the release tree, runs every
#                               C++ and Python suite not labelled slow.
#   bash tools/test.sh --full   CI (.ci/run): every suite, the slow ones too,
#                               then ThreadSanitizer, AddressSanitizer + UBSan,
#                               fuzzing and one tiny run of every benchmark.
#
# Each stage prints its wall time. The last line counts the cases that
# passed, failed and were skipped; a skip is never a pass, and each skip is
# listed with its reason. Under --full a case that would skip for want of
# something this machine should have (torch, root, a loop device, io_uring,
# ckpt-restore, gloo) fails instead (CKPT_TEST_REQUIRE_ALL=1), and the run
# refuses to start without torch, root or a loop device.
#   CKPT_BUILD_DIR=DIR        the release tree (default build)
#   CKPT_SKIP_TSAN=1, CKPT_SKIP_ASAN=1, CKPT_SKIP_FUZZ=1, CKPT_SKIP_BENCH=1
#                             (--full) leave that stage out; the run says so
#   CKPT_FUZZ_SECONDS=N       seconds per fuzz target (default 10)
set -euo pipefail
cd "$(dirname "$0")/.."

full=0
case "${1:-}" in
  --full) full=1 ;;
  "") ;;
  *) echo "usage: bash tools/test.sh [--full]" >&2; exit 2 ;;
esac

set -E
stage=""
stage_start=$SECONDS
begin() { stage=$1; stage_start=$SECONDS; echo "== test.sh: $stage"; }
end() { echo "== test.sh: $stage took $((SECONDS - stage_start)) s (total $SECONDS s)"; }
trap 'echo "== test.sh: FAILED in stage \"$stage\" (line $LINENO)" >&2' ERR
die() { echo "== test.sh: $*" >&2; exit 1; }
failures=()

# -- setup: what a fresh machine lacks (apt, pip); nothing when all is there.
begin "setup (what this machine lacks)"
tools/setup.sh --deps-only
python=$(python3 -c 'import sys; print(sys.executable)')
"$python" -c "import torch" 2>/dev/null ||
  die "no torch in $python: the Python suites need it (tools/setup.sh installs it)"
if ((full)); then
  [[ $(id -u) -eq 0 ]] ||
    die "--full runs the real full-disk suite, which mounts a tmpfs and an ext4 image: run it as root"
  [[ -e /dev/loop-control ]] && losetup -f >/dev/null 2>&1 ||
    die "--full needs a free loop device for the ext4 image (losetup -f found none)"
  export CKPT_TEST_REQUIRE_ALL=1
fi
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  # Paths relative to the checkout, and (these trees carry debug info) no
  # build directory in the hash: another clone or tree of the same sources
  # hits the cache (gdb then shows the first compile's directory).
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
fi
end

# -- build: the release tree, torch extension required (CKPT_BUILD_TORCH=ON:
# a torch that cannot be found fails here instead of dropping the Python
# suites).
begin "build (release tree)"
build_dir=${CKPT_BUILD_DIR:-build}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCKPT_PYTHON="$python" \
  -DCKPT_BUILD_TORCH=ON "${launcher[@]}" >/dev/null
cmake --build "$build_dir" -j2
results=$(cd "$build_dir" && pwd)/test-results
rm -rf "$results"
mkdir -p "$results/gtest"
end

# -- ctest: every suite (quick: those not labelled slow).
begin "ctest"
labels=()
((full)) || labels=(-LE slow)
python_suites=$(ctest --test-dir "$build_dir" -N -L python "${labels[@]}" | sed -n 's/^Total Tests: //p')
[[ ${python_suites:-0} -gt 0 ]] || die "ctest has no Python suites: the torch extension was not configured"
export CKPT_LOG=${CKPT_LOG:-warning}
ctest --test-dir "$build_dir" -j2 --no-tests=error --output-on-failure --timeout 900 "${labels[@]}" \
  --output-junit "$results/ctest.xml" || failures+=("ctest")
end

# Runs each GoogleTest binary given (as "name filter") two at a time, with
# its XML report in $results/gtest/LABEL-name.xml; a binary that fails or
# whose filter matches no test fails the stage.
run_gtests() {
  local label=$1 dir=$2 env_vars=$3
  shift 3
  printf '%s\n' "$@" | xargs -P2 -L1 bash -c '
    label=$0 dir=$1 env_vars=$2 name=$3 filter=$4
    log="$RESULTS/gtest/$label-$name.log"
    xml="$RESULTS/gtest/$label-$name.xml"
    if ! env $env_vars "$dir/tests/$name" --gtest_brief=1 --gtest_filter="$filter" \
         --gtest_output="xml:$xml" >"$log" 2>&1; then
      echo "== $label: $name FAILED"; tail -n 60 "$log"
      # A crash or a sanitizer abort leaves no report: count it here.
      [[ -s $xml ]] || printf "%s: %s\tfailed\tended before its report (see %s)\n" "$label" "$name" "$log" \
        >>"$RESULTS/extra.tsv"
      exit 1
    fi
    ran=$(sed -n "s/^\[==========\] \([0-9]*\) tests\? from .* ran\..*/\1/p" "$log" | tail -n 1)  # (children print their own)
    if [[ ${ran:-0} -eq 0 ]]; then
      echo "== $label: $name: the filter \"$filter\" matched no test"
      printf "%s: %s\tfailed\tthe filter %s matched no test\n" "$label" "$name" "$filter" >>"$RESULTS/extra.tsv"
      exit 1
    fi
    echo "== $label: $name: $ran tests"
  ' "$label" "$dir" "$env_vars"
}
export RESULTS=$results

sanitizer_tree() {  # DIR CMAKE_OPTION TARGETS...
  local dir=$1 option=$2
  shift 2
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$option" "${launcher[@]}" \
    -DCKPT_BUILD_BENCH=OFF -DCKPT_BUILD_TOOLS=OFF -DCKPT_BUILD_TORCH=OFF -DCKPT_WITH_CUDA=OFF >/dev/null
  cmake --build "$dir" -j2 --target "$@"
}

if ((full)) && [[ ${CKPT_SKIP_TSAN:-0} != 1 ]]; then
  # Debian's Abseil is not TSAN-instrumented; ckpt's own locks are std::mutex
  # based (util/mutex.h), so reports here are real. Left out: the two-rank
  # crash sweep (it repeats what the other cases cover, 100 times) and all
  # but two cases of chain_restore_test's one codec (each builds an 11-save
  # chain, ~30 s under TSan).
  begin "ThreadSanitizer build and run"
  tsan_runs=("chain_restore_test *EveryStep*/planes:*FoundLinkByLink/planes"
             "preemption_test *" "distributed_engine_test -*ACrashOfRankZero*"
             "distributed_node_local_test *" "distributed_resume_test *" "async_engine_test *" "engine_test *" "delta_test *"
             "device_staging_test *" "stall_timeout_test *" "encoder_buffers_test *"
             "staging_copy_test *" "worker_pool_test *" "planes_compression_test *"
             "delta_policy_test *" "resume_agreement_test *" "engine_tier_test *")
  sanitizer_tree "${CKPT_TSAN_BUILD_DIR:-build-tsan}" -DCKPT_TSAN=ON "${tsan_runs[@]%% *}"
  run_gtests tsan "${CKPT_TSAN_BUILD_DIR:-build-tsan}" \
    "TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1" "${tsan_runs[@]}" || failures+=("tsan")
  end
elif ((full)); then
  echo "== test.sh: ThreadSanitizer left out (CKPT_SKIP_TSAN=1)"
  printf 'ThreadSanitizer stage\tskipped\tCKPT_SKIP_TSAN=1\n' >>"$results/extra.tsv"
fi

if ((full)) && [[ ${CKPT_SKIP_ASAN:-0} != 1 ]]; then
  # The suites that parse what is on disk, fault-inject every call and drive
  # the engine's threads; any report fails the run.
  begin "AddressSanitizer + UBSan build and run"
  asan_runs=("fault_injection_test *" "chain_restore_test */zstd:*/planes"
             "distributed_engine_test -*ACrashOfRankZero*" "distributed_node_local_test *"
             "compact_test *" "engine_test *"
             "async_engine_test *" "delta_test *" "hostile_checkpoint_test *" "staging_copy_test *"
             "encoder_buffers_test *" "file_system_conformance_test *" "stall_timeout_test *"
             "sharded_tensor_test *" "plane_codec_test *" "delta_codec_test *"
             "planes_compression_test *" "delta_policy_test *"
             "object_store_test ConfigTest.*:SigV4Test.*:S3XmlTest.*:ObjectUrlTest.*:Crc32cTest.*")
  sanitizer_tree "${CKPT_ASAN_BUILD_DIR:-build-asan}" -DCKPT_ASAN=ON "${asan_runs[@]%% *}"
  run_gtests asan "${CKPT_ASAN_BUILD_DIR:-build-asan}" \
    "ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1" \
    "${asan_runs[@]}" || failures+=("asan")
  end
elif ((full)); then
  echo "== test.sh: AddressSanitizer left out (CKPT_SKIP_ASAN=1)"
  printf 'AddressSanitizer stage\tskipped\tCKPT_SKIP_ASAN=1\n' >>"$results/extra.tsv"
fi

if ((full)) && [[ ${CKPT_SKIP_FUZZ:-0} != 1 ]]; then
  # The fuzz regressions, then a short libFuzzer run of each target from its
  # seed corpus (tests/fuzz); any crash, sanitizer report, property violation
  # or failing target fails.
  begin "fuzz build and run"
  fuzz_dir=${CKPT_FUZZ_BUILD_DIR:-build-fuzz}
  cmake -S tests/fuzz -B "$fuzz_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_COMPILER=clang++ "${launcher[@]}" >/dev/null
  cmake --build "$fuzz_dir" -j2
  CKPT_FUZZ_RESULTS="$results/extra.tsv" tests/fuzz/run.sh "$fuzz_dir" "${CKPT_FUZZ_SECONDS:-10}" ||
    failures+=("fuzz")
  end
elif ((full)); then
  echo "== test.sh: fuzzing left out (CKPT_SKIP_FUZZ=1)"
  printf 'fuzz stage\tskipped\tCKPT_SKIP_FUZZ=1\n' >>"$results/extra.tsv"
fi

if ((full)) && [[ ${CKPT_SKIP_BENCH:-0} != 1 ]]; then
  # Every benchmark once at tiny sizes, on the release tree: a bench that
  # broke fails here, not in the hands of the next person who measures.
  begin "bench smoke run"
  CKPT_BUILD_DIR="$(cd "$build_dir" && pwd)" CKPT_BENCH_RESULTS="$results/extra.tsv" \
    bash bench/run_all.sh --smoke >/dev/null || failures+=("bench smoke")
  end
elif ((full)); then
  echo "== test.sh: bench smoke run left out (CKPT_SKIP_BENCH=1)"
  printf 'bench smoke stage\tskipped\tCKPT_SKIP_BENCH=1\n' >>"$results/extra.tsv"
fi

trap - ERR
summary=0
"$python" tools/test_summary.py "$results" || summary=1
if ((${#failures[@]})); then
  echo "== test.sh: FAILED: ${failures[*]}" >&2
  exit 1
fi
exit $summary
