#!/usr/bin/env bash
# check.sh: ckpt's GPU check, on a machine with a CUDA device, from the kit
# bench/gpu/prepare.sh made on the build machine (.gpu-kit/, carried over).
# Installs nothing and needs no network: only the kit, python3 with torch,
# CMake and a C++ compiler (for the extension; if its build fails, the
# prebuilt one from the kit is used and the summary says why).
#
#   bash bench/gpu/check.sh          # results under $OUT (default ./gpu-out)
#
# Steps, each with a deadline: the GPU and driver (nvidia-smi); in the
# background, the LibTorch extension built against this machine's torch;
# the C++ GPU tests (cuda_stager_test, device_staging_test,
# async_engine_test, copy_coalescer_test); gpu_bench (C++, one JSON line);
# tests/python/test_cuda.py (the torch path: GPT + AdamW on the GPU, eager
# and lazy, deltas, restore into CUDA tensors, resume; default allocator and
# expandable segments); bench/gpu_torch_bench.py (one JSON line). Writes
# $OUT/check.log (everything), $OUT/results.jsonl (the benches' lines) and
# prints a summary. Exits non-zero if any step failed, or if a GPU is
# visible but the GPU tests skipped. About 6-8 minutes on an H200 machine.
set -uo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
kit=$repo/.gpu-kit
out=${OUT:-$repo/gpu-out}
mkdir -p "$out"
log=$out/check.log
results=$out/results.jsonl
: >"$log"
: >"$results"
start=$SECONDS
summary=()
failed=0
note() { summary+=("$1"); echo "[gpu_check] $1" | tee -a "$log" >&2; }
fail() { note "FAIL: $1"; failed=1; }
finish() {
  echo "[gpu_check] ===== summary ($((SECONDS - start)) s) =====" | tee -a "$log" >&2
  for line in "${summary[@]}"; do echo "[gpu_check]   $line" | tee -a "$log" >&2; done
  if ((failed)); then echo "[gpu_check] RESULT: FAILED" | tee -a "$log" >&2; exit 1; fi
  echo "[gpu_check] RESULT: OK" | tee -a "$log" >&2
  exit 0
}
[[ -x $kit/bin/gpu_bench ]] || { fail "no kit at $kit: run bench/gpu/prepare.sh on the build machine and carry .gpu-kit"; finish; }
export LD_LIBRARY_PATH=$kit/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
tmp=${CKPT_GPU_TMP:-/tmp/ckpt-gpu-check}
rm -rf "$tmp" && mkdir -p "$tmp"
export TEST_TMPDIR=$tmp CKPT_LOG=${CKPT_LOG:-warning} PYTHONUNBUFFERED=1

gpu_visible=0
if smi=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1); then
  note "GPU: $smi"
  gpu_visible=1
else
  note "nvidia-smi: ${smi%%$'\n'*}"
fi
note "kernel $(uname -r); $(python3 -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1 | tail -1)"

# The extension, against this machine's torch, while the C++ tests run.
ext_build=$tmp/ext
(
  export CC=${CC:-cc} CXX=${CXX:-c++}
  gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
  timeout 300 cmake -S bench/gpu/ext -B "$ext_build" "${gen[@]}" -DCKPT_KIT="$kit" -DCKPT_PYTHON=python3 &&
    timeout 300 cmake --build "$ext_build" -j"$(nproc)"
) >"$out/ext_build.log" 2>&1 &
ext_pid=$!

for t in cuda_stager_test device_staging_test async_engine_test copy_coalescer_test; do
  timeout 240 "$kit/bin/$t" --gtest_brief=1 --gtest_color=no >"$tmp/$t.log" 2>&1
  rc=$?
  cat "$tmp/$t.log" >>"$log"
  passed=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$tmp/$t.log" | tail -1)
  skipped=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$tmp/$t.log" | tail -1)
  if ((rc != 0)); then
    fail "$t: exit $rc (${passed:-0} passed); $(grep -m3 -E 'FAILED|Failure' "$tmp/$t.log" | tr '\n' ' ')"
  else
    note "$t: ${passed:-0} passed, ${skipped:-0} skipped"
  fi
done
# (With one GPU, two cases skip by design: the second-device one and the
# no-device one. The device cases must run.)
if ((gpu_visible)) && grep -q 'no CUDA device (' "$tmp/cuda_stager_test.log"; then
  fail "a GPU is visible but cuda_stager_test's device cases skipped: $(grep -m1 'no CUDA device (' "$tmp/cuda_stager_test.log")"
fi

if line=$(timeout 300 "$kit/bin/gpu_bench" --dir="$tmp" 2>>"$log"); then
  echo "$line" >>"$results"
  note "gpu_bench: $line"
else
  fail "gpu_bench failed (see check.log)"
fi

wait "$ext_pid"
ext_rc=$?
if ((ext_rc == 0)) && [[ -f $ext_build/_ckpt_torch.so ]]; then
  ext=$ext_build/_ckpt_torch.so
  note "extension built here against $(python3 -c 'import torch; print(torch.__version__)')"
else
  ext=$kit/prebuilt/_ckpt_torch.so
  note "extension build here failed (exit $ext_rc; $(grep -m1 -iE 'error' "$out/ext_build.log" | cut -c1-200)); using the prebuilt one for torch $(cat "$kit/prebuilt/TORCH_VERSION")"
fi
export CKPT_TORCH_EXT_LIB=$ext

pytest_out=$tmp/pytest.log
timeout 420 python3 -m pytest -q -p no:cacheprovider -rs tests/python/test_cuda.py >"$pytest_out" 2>&1
rc=$?
cat "$pytest_out" >>"$log"
last=$(tail -1 "$pytest_out")
if ((rc != 0)); then
  fail "test_cuda.py: exit $rc: $last"
elif ((gpu_visible)) && grep -q skipped "$pytest_out"; then
  fail "test_cuda.py skipped cases on a machine with a GPU: $last"
else
  note "test_cuda.py: $last"
fi

if line=$(timeout 420 python3 bench/gpu_torch_bench.py --dir "$tmp" --reps "${CKPT_GPU_REPS:-5}" 2>>"$log" | tail -1) &&
   [[ $line == \{* ]]; then
  echo "$line" >>"$results"
  note "gpu_torch_bench: $line"
else
  fail "gpu_torch_bench failed (see check.log)"
fi
rm -rf "$tmp"
finish
