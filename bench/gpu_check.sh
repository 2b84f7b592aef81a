#!/usr/bin/env bash
# gpu_check.sh: builds ckpt with CUDA and runs its GPU checks, on a machine
# with a CUDA device. Installs nothing: the build dependencies of tools/setup.sh
# (cmake, ninja or make, g++, liburing, zstd, xxhash, Abseil, GoogleTest,
# nlohmann-json) and a CUDA toolkit must already be there. LibTorch is not
# needed: the LibTorch extension's option is switched off for this build.
#
#   bench/gpu_check.sh            # build-gpu/ next to this checkout
#
# Steps: Release configure with CKPT_WITH_CUDA=ON in $CKPT_GPU_BUILD_DIR
# (default <repo>/build-gpu); build only ckpt, cuda_stager_test,
# device_staging_test, async_engine_test and gpu_bench with -j$CKPT_GPU_JOBS
# (default 16); run the three tests and the GPU bench (its JSON line goes to
# stdout); print a summary. Everything else goes to stderr. Exits non-zero if
# the build or a test fails, or if a GPU is visible to nvidia-smi but the GPU
# tests skipped (e.g. a driver too old for the toolkit). Meant to finish in
# well under 5 minutes on 16 cores.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${CKPT_GPU_BUILD_DIR:-$ROOT/build-gpu}"
JOBS="${CKPT_GPU_JOBS:-16}"
TARGETS=(ckpt cuda_stager_test device_staging_test async_engine_test gpu_bench)
TESTS=(cuda_stager_test device_staging_test async_engine_test)
START=$(date +%s)

log() { echo "[gpu_check] $*" >&2; }
elapsed() { echo "$(($(date +%s) - START))s"; }
SUMMARY=()
FAILED=0
note() { SUMMARY+=("$1"); }
fail() { SUMMARY+=("FAIL: $1"); FAILED=1; }
finish() {
  echo "[gpu_check] ===== summary ($(elapsed)) =====" >&2
  for line in "${SUMMARY[@]}"; do echo "[gpu_check]   $line" >&2; done
  if ((FAILED)); then echo "[gpu_check] RESULT: FAILED" >&2; exit 1; fi
  echo "[gpu_check] RESULT: OK" >&2
  exit 0
}

# --- The machine -----------------------------------------------------------
GPU_VISIBLE=0
if command -v nvidia-smi >/dev/null 2>&1; then
  if smi=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1); then
    while IFS= read -r line; do log "GPU: $line"; note "GPU: $line"; done <<<"$smi"
    [[ -n "$smi" ]] && GPU_VISIBLE=1
  else
    log "nvidia-smi failed: $smi"
    note "nvidia-smi failed: ${smi%%$'\n'*}"
  fi
else
  note "nvidia-smi not found: cannot tell whether a GPU is present"
fi
CUDA_ROOT="${CUDAToolkit_ROOT:-/usr/local/cuda}"
if [[ -x "$CUDA_ROOT/bin/nvcc" ]]; then
  note "CUDA toolkit: $("$CUDA_ROOT/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p') at $CUDA_ROOT"
else
  note "no nvcc under $CUDA_ROOT (set CUDAToolkit_ROOT); CMake will search elsewhere"
fi
for tool in cmake g++; do
  command -v "$tool" >/dev/null 2>&1 || { fail "$tool not found (this script installs nothing)"; finish; }
done
GENERATOR="Unix Makefiles"
command -v ninja >/dev/null 2>&1 && GENERATOR=Ninja

# --- Configure -------------------------------------------------------------
CONFIG=(-DCMAKE_BUILD_TYPE=Release -DCKPT_WITH_CUDA=ON -DCKPT_BUILD_TESTS=ON -DCKPT_BUILD_BENCH=ON
        -DCKPT_BUILD_TOOLS=OFF "-DCUDAToolkit_ROOT=$CUDA_ROOT")
# LibTorch is not needed here: every CKPT_*TORCH* option (or cache variable)
# the tree defines is switched off, whether LibTorch is installed or not.
TORCH_OPTIONS=$(grep -hoE '(option|set)\((CKPT_[A-Z_]*TORCH[A-Z_]*)' "$ROOT/CMakeLists.txt" "$ROOT"/*/CMakeLists.txt 2>/dev/null |
                sed -E 's/^(option|set)\(//' | sort -u)
for opt in $TORCH_OPTIONS; do CONFIG+=("-D$opt=OFF"); done
TORCH_FOUND=absent
if command -v python3 >/dev/null 2>&1 &&
   timeout 60 python3 -c 'import torch' >/dev/null 2>&1; then
  TORCH_FOUND="installed (not used)"
fi
note "LibTorch: $TORCH_FOUND${TORCH_OPTIONS:+; switched off: ${TORCH_OPTIONS//$'\n'/ }}"
mkdir -p "$BUILD"
log "configure: cmake -S $ROOT -B $BUILD -G $GENERATOR ${CONFIG[*]}"
if ! cmake -S "$ROOT" -B "$BUILD" -G "$GENERATOR" "${CONFIG[@]}" >"$BUILD/gpu_check.configure.log" 2>&1; then
  tail -n 40 "$BUILD/gpu_check.configure.log" >&2
  fail "configure (log: $BUILD/gpu_check.configure.log; missing dependencies? see tools/setup.sh)"
  finish
fi
note "configured ($GENERATOR, Release, CKPT_WITH_CUDA=ON) in $(elapsed)"

# --- Build -----------------------------------------------------------------
log "build: ${TARGETS[*]} with -j$JOBS"
if ! timeout 600 cmake --build "$BUILD" -j "$JOBS" --target "${TARGETS[@]}" >"$BUILD/gpu_check.build.log" 2>&1; then
  grep -E -B2 -A6 'error|Error' "$BUILD/gpu_check.build.log" | tail -n 60 >&2
  fail "build (log: $BUILD/gpu_check.build.log)"
  finish
fi
note "built ${TARGETS[*]} by $(elapsed)"
for bin in "$BUILD/tests/cuda_stager_test" "$BUILD/bench/gpu_bench"; do
  if ldd "$bin" 2>/dev/null | grep -q 'libcudart\.so'; then
    note "warning: $(basename "$bin") links libcudart.so dynamically"
  fi
done

# --- Tests -----------------------------------------------------------------
TMP="$BUILD/gpu_check_tmp"
rm -rf "$TMP" && mkdir -p "$TMP"
export TEST_TMPDIR="$TMP" CKPT_LOG="${CKPT_LOG:-warning}"
for t in "${TESTS[@]}"; do
  out="$BUILD/$t.log"
  log "run $t"
  timeout 180 "$BUILD/tests/$t" --gtest_color=no >"$out" 2>&1
  rc=$?
  passed=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$out" | tail -1)
  skipped=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$out" | tail -1)
  if ((rc != 0)); then
    grep -E '^\[  FAILED  \]|Failure|rror' "$out" | head -n 30 >&2
    fail "$t: exit $rc${passed:+, $passed passed} (log: $out)"
  else
    note "$t: ${passed:-0} passed, ${skipped:-0} skipped"
  fi
done
# On a GPU machine the device tests must have run, not skipped.
stager_log="$BUILD/cuda_stager_test.log"
if grep -q '^\[       OK \] CudaStagerTest.EagerSaveFromASideStreamHoldsValuesBeforeTheOverwrite' "$stager_log"; then
  note "GPU stager tests ran on the device"
elif ((GPU_VISIBLE)); then
  reason=$(grep -m1 -A1 'Skipped' "$stager_log" | tail -1)
  fail "a GPU is visible but the GPU stager tests did not run: ${reason:-see $stager_log}"
else
  note "GPU stager tests skipped: no device"
fi

# --- Bench -----------------------------------------------------------------
log "run gpu_bench"
bench_json=$(timeout 240 "$BUILD/bench/gpu_bench" --dir="$TMP" 2>"$BUILD/gpu_bench.log")
rc=$?
if ((rc != 0)); then
  tail -n 20 "$BUILD/gpu_bench.log" >&2
  fail "gpu_bench: exit $rc (log: $BUILD/gpu_bench.log)"
else
  echo "$bench_json"
  note "gpu_bench: $bench_json"
fi
rm -rf "$TMP"
finish
