#!/usr/bin/env bash
# run_all.sh: the one entry point for every benchmark of ckpt.
#
#   bench/run_all.sh [--quick|--smoke] [--only NAME[,NAME...]]
#
# --smoke: every bench once at tiny sizes, seconds each, on the tree in
# $CKPT_BUILD_DIR as it is configured (tools/test.sh --full runs this so
# that a bench that broke fails CI); its figures measure nothing. Each
# bench's outcome is appended to $CKPT_BENCH_RESULTS when set.
#
# Installs missing build dependencies (apt), builds a Release tree in
# $CKPT_BUILD_DIR (default <repo>/build-bench), runs each bench and prints its
# JSON lines on stdout; everything else goes to stderr. Data is written under
# $CKPT_BENCH_DIR (default: a temp dir inside the build dir, i.e. on the same
# disk), removed at the end unless CKPT_BENCH_KEEP=1.
#
# Adding a bench: add `ckpt_add_bench(NAME ...)` to bench/CMakeLists.txt, write
# a `bench_NAME` function below (it gets the data dir as $1 and prints JSON
# lines), and append NAME to BENCHES.
set -euo pipefail

BENCHES=(io async_save delta chain_restore torch_api real_state preemption background_priority peers restore distributed reshard dcp_plugin object_tier)

# bench_io DATA_DIR: durable write and cold restore per I/O backend vs fio.
bench_io() {
  local args=(--dir="$1/io")
  if ((SMOKE)); then
    args+=(--bytes=$((8 << 20)) --tensors=8 --reps=1)
  elif ((QUICK)); then
    args+=(--bytes=$((256 << 20)) --reps=3)
  else
    args+=(--bytes=$((1 << 30)) --reps=5)
  fi
  if ((KEEP)); then args+=(--keep); fi
  "$BUILD_DIR/bench/io_bench" "${args[@]}"
}

# bench_async_save DATA_DIR: SaveAsync blocked time vs memcpy and torch.save;
# durable throughput vs fio; many small tensors vs few large ones. Also draws
# the blocked-time plot (matplotlib) and table into $CKPT_BENCH_OUT.
bench_async_save() {
  local args=(--dir="$1/async" --torch_script="$ROOT/bench/torch_save_baseline.py" --python="$PYTHON")
  if ((SMOKE)); then
    args+=(--bytes=$((8 << 20)) --tensors=8 --small_tensors=64 --saves=1 --torch_reps=1 --lazy_compute_s=0.05)
  elif ((QUICK)); then
    args+=(--bytes=$((256 << 20)) --saves=3 --torch_reps=2)
  else
    args+=(--bytes=$((1200 << 20)) --saves=5 --torch_reps=3)
  fi
  "$BUILD_DIR/bench/async_save_bench" "${args[@]}" | tee "$1/async_save.jsonl"
  /usr/bin/python3 "$ROOT/bench/plot_async_save.py" "$1/async_save.jsonl" \
    "${CKPT_BENCH_OUT:-$BUILD_DIR/bench-results}" >&2 || log "plot skipped"
}

# bench_delta DATA_DIR: bytes per delta vs full, blocked and restore times.
bench_delta() {
  local args=(--dir="$1/delta")
  if ((SMOKE)); then
    args+=(--bytes=$((8 << 20)) --tensors=8 --chain=2 --fractions=0.01 --codec_bytes=$((1 << 20)))
  elif ((QUICK)); then
    args+=(--bytes=$((256 << 20)) --chain=5 --fractions=0.01)
  else
    args+=(--bytes=$((1 << 30)) --chain=10)
  fi
  "$BUILD_DIR/bench/delta_bench" "${args[@]}"
}

# bench_chain_restore DATA_DIR: MB/s of stored bytes restoring an 11-link
# exact delta chain of an AdamW state vs its full checkpoint.
bench_chain_restore() {
  local args=(--dir="$1/chain_restore")
  if ((SMOKE)); then
    args+=(--hidden=32 --layers=1 --warmup=2 --saves=3 --reps=1)
  elif ((QUICK)); then
    args+=(--reps=3)
  fi
  "$BUILD_DIR/bench/chain_restore_bench" "${args[@]}"
}

# bench_torch_api DATA_DIR: the same state through the Python API: blocked
# time vs torch.save and vs copy_ into pre-allocated tensors (eager and lazy).
bench_torch_api() {
  local args=(--dir="$1/torch_api")
  ((QUICK)) && args+=(--quick)
  ((SMOKE)) && args+=(--layers=1 --reps=1)
  ((KEEP)) && args+=(--keep)
  PYTHONPATH="$ROOT/torch_ext/python" CKPT_TORCH_EXT_LIB="$BUILD_DIR/torch_ext/_ckpt_torch.so" \
    "$PYTHON" "$ROOT/bench/torch_api_bench.py" "${args[@]}"
}

# bench_real_state DATA_DIR: a GPT + AdamW state (~1.4 GB; quick ~240 MB)
# saved between real training steps: blocked time vs copy_ in the loop, first
# save, durable vs fio, delta sizes, restore vs torch.load, step slowdown while
# persisting, engine CPU per GB.
bench_real_state() {
  local args=(--dir="$1/real_state")
  ((QUICK)) && args+=(--quick)
  ((SMOKE)) && args+=(--reps=1)
  ((KEEP)) && args+=(--keep)
  PYTHONPATH="$ROOT/torch_ext/python" CKPT_TORCH_EXT_LIB="$BUILD_DIR/torch_ext/_ckpt_torch.so" \
    "$PYTHON" "$ROOT/bench/real_state_bench.py" "${args[@]}"
}

# bench_preemption DATA_DIR: SIGTERM to the final save being durable, with and
# without a save in flight, in a child training the real_state GPT.
bench_preemption() {
  local args=(--dir="$1/preemption")
  ((QUICK)) && args+=(--quick)
  PYTHONPATH="$ROOT/torch_ext/python" CKPT_TORCH_EXT_LIB="$BUILD_DIR/torch_ext/_ckpt_torch.so" \
    "$PYTHON" "$ROOT/bench/preemption_bench.py" "${args[@]}"
}

# bench_background_priority DATA_DIR: a 2-thread CPU training loop's step time
# while saves persist, with the background threads at nice 0 and 10.
bench_background_priority() {
  local args=(--dir="$1/background_priority")
  ((QUICK)) && args+=(--mb=128)
  ((SMOKE)) && args+=(--mb=8)
  PYTHONPATH="$ROOT/torch_ext/python" CKPT_TORCH_EXT_LIB="$BUILD_DIR/torch_ext/_ckpt_torch.so" \
    "$PYTHON" "$ROOT/bench/background_priority_bench.py" "${args[@]}"
}

# bench_peers DATA_DIR: ckpt eager/lazy vs torch.save, dcp.save and
# dcp.async_save (synchronous and asynchronous staging) in one training loop:
# stall per save, time to durable, bytes, extra peak RSS, cold restore. Draws
# the comparison plot into $CKPT_BENCH_OUT.
bench_peers() {
  local args=(--dir="$1/peers")
  ((QUICK)) && args+=(--quick)
  ((SMOKE)) && args+=(--saves=2)
  ((KEEP)) && args+=(--keep)
  PYTHONPATH="$ROOT/torch_ext/python" CKPT_TORCH_EXT_LIB="$BUILD_DIR/torch_ext/_ckpt_torch.so" \
    "$PYTHON" "$ROOT/bench/peers_bench.py" "${args[@]}" | tee "$1/peers.jsonl"
  /usr/bin/python3 "$ROOT/bench/plot_peers.py" "$1/peers.jsonl" \
    "${CKPT_BENCH_OUT:-$BUILD_DIR/bench-results}" >&2 || log "plot skipped"
}

# bench_restore DATA_DIR: cold restores, each in a fresh process, >= 3 rounds
# in alternating order: ckpt.load(into=), fresh ckpt.load, compressed and
# newest-of-11-chained restores, dcp.load, against fio O_DIRECT and a buffered
# read of the same files measured in the same rounds.
bench_restore() {
  local args=(--dir="$1/restore")
  ((QUICK)) && args+=(--quick)
  ((SMOKE)) && args+=(--quick --no-chain)
  ((KEEP)) && args+=(--keep)
  PYTHONPATH="$ROOT/torch_ext/python" CKPT_TORCH_EXT_LIB="$BUILD_DIR/torch_ext/_ckpt_torch.so" \
    "$PYTHON" "$ROOT/bench/restore_bench.py" "${args[@]}"
}

# bench_object_tier DATA_DIR: ckpt-retain's upload to a bucket and ckpt.load
# from it vs boto3's transfer manager moving the same bytes, both against
# moto's S3 server on loopback (256 MiB; quick 64 MiB).
bench_object_tier() {
  local args=(--dir="$1/object_tier" --build="$BUILD_DIR")
  if ((SMOKE)); then
    args+=(--mb=8 --reps=1)
  elif ((QUICK)); then
    args+=(--mb=64 --reps=3)
  else
    args+=(--mb=256 --reps=5)
  fi
  ((KEEP)) && args+=(--keep)
  PYTHONPATH="$ROOT/torch_ext/python" CKPT_TORCH_EXT_LIB="$BUILD_DIR/torch_ext/_ckpt_torch.so" \
    "$PYTHON" "$ROOT/bench/object_tier_bench.py" "${args[@]}"
}

# bench_distributed DATA_DIR: 2 ranks (gloo, one process each) writing a 1 GiB
# state together (quick 256 MiB) vs one rank writing the same bytes: aggregate
# durable throughput ratio, commit latency, blocked time per rank.
bench_distributed() {
  local args=(--dir="$1/distributed")
  ((QUICK)) && args+=(--quick)
  ((SMOKE)) && args+=(--bytes=$((8 << 20)) --saves=1)
  ((KEEP)) && args+=(--keep)
  PYTHONPATH="$ROOT/torch_ext/python" CKPT_TORCH_EXT_LIB="$BUILD_DIR/torch_ext/_ckpt_torch.so" \
    "$PYTHON" "$ROOT/bench/distributed_bench.py" "${args[@]}"
}

# bench_reshard DATA_DIR: a DTensor state (~350 MiB; quick ~85 MiB) saved by 2
# ranks, loaded cold by 1 and by 2 ranks, ckpt vs dcp.save/dcp.load of the same
# DTensors: load time ratio and bytes read over the bytes the boxes need.
bench_reshard() {
  local args=(--dir="$1/reshard")
  ((QUICK)) && args+=(--quick)
  ((SMOKE)) && args+=(--vocab=1024 --d=64 --layers=1 --repeat=3)
  ((KEEP)) && args+=(--keep)
  PYTHONPATH="$ROOT/torch_ext/python" CKPT_TORCH_EXT_LIB="$BUILD_DIR/torch_ext/_ckpt_torch.so" \
    "$PYTHON" "$ROOT/bench/reshard_bench.py" "${args[@]}"
}

# bench_dcp_plugin DATA_DIR: dcp.save / dcp.async_save / dcp.load of a GPT +
# AdamW state (~1.1 GB; quick ~190 MB) through ckpt.dcp vs DCP's FileSystemWriter
# and Reader (2 threads each), a fresh process per side, alternating, medians.
bench_dcp_plugin() {
  local args=(--dir="$1/dcp_plugin")
  ((QUICK)) && args+=(--quick)
  ((SMOKE)) && args+=(--quick --rounds=1)
  PYTHONPATH="$ROOT/torch_ext/python" CKPT_TORCH_EXT_LIB="$BUILD_DIR/torch_ext/_ckpt_torch.so" \
    "$PYTHON" "$ROOT/bench/dcp_plugin_bench.py" "${args[@]}"
}

# ---------------------------------------------------------------------------

log() { echo "[run_all] $*" >&2; }
die() { log "error: $*"; exit 1; }

QUICK=0
SMOKE=0
ONLY=""
while (($#)); do
  case "$1" in
    --quick) QUICK=1 ;;
    --smoke) SMOKE=1 ;;
    --only) shift; ONLY="${1:-}" ;;
    --only=*) ONLY="${1#--only=}" ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 0 ;;
    *) die "unknown argument: $1" ;;
  esac
  shift
done
if [[ -n "$ONLY" ]]; then
  IFS=, read -r -a BENCHES <<<"$ONLY"
fi
for b in "${BENCHES[@]}"; do
  declare -F "bench_$b" >/dev/null || die "no bench named '$b'"
done

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${CKPT_BUILD_DIR:-$ROOT/build-bench}"
KEEP="${CKPT_BENCH_KEEP:-0}"
[[ "$KEEP" == 1 ]] || KEEP=0

# Packages: checked with dpkg first, so a prepared machine pays nothing.
PACKAGES=(fio cmake ninja-build g++ liburing-dev libzstd-dev libxxhash-dev libabsl-dev
          libgtest-dev nlohmann-json3-dev)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  log "installing: ${missing[*]}"
  SUDO=""
  ((EUID == 0)) || SUDO="sudo"
  $SUDO apt-get update >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y "${missing[@]}" >&2
fi

# The Python benches and the extension use the `python3` on PATH (PyPI torch).
PYTHON="$(python3 -c 'import sys; print(sys.executable)')"
"$PYTHON" -c "import torch" 2>/dev/null || log "no torch in $PYTHON: run tools/setup.sh first (the Python benches will fail)"

if ((SMOKE)) && [[ -f "$BUILD_DIR/CMakeCache.txt" ]]; then
  log "smoke run: building the benches in $BUILD_DIR as it is configured"
else
  log "building $BUILD_DIR (Release)"
  cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCKPT_PYTHON="$PYTHON" >&2
fi
cmake --build "$BUILD_DIR" -j2 --target ckpt_benches >&2
((SMOKE)) && export CKPT_BENCH_SMOKE=1

if [[ -n "${CKPT_BENCH_DIR:-}" ]]; then
  mkdir -p "$CKPT_BENCH_DIR"
  DATA_DIR="$(mktemp -d "$CKPT_BENCH_DIR/run.XXXXXX")"
else
  DATA_DIR="$(mktemp -d "$BUILD_DIR/bench-data.XXXXXX")"
fi
FSTYPE="$(stat -f -c %T "$DATA_DIR")"
log "data dir $DATA_DIR ($FSTYPE)"
if [[ "$FSTYPE" == tmpfs ]]; then
  log "warning: $DATA_DIR is tmpfs: data stays in memory, figures say nothing about a disk"
fi

cleanup() {
  if ((KEEP)); then
    log "kept checkpoints under $DATA_DIR"
  else
    rm -rf "$DATA_DIR"
  fi
}
trap cleanup EXIT

failed=()
for b in "${BENCHES[@]}"; do
  log "bench $b"
  start=$SECONDS
  if ! "bench_$b" "$DATA_DIR"; then
    failed+=("$b")
    log "bench $b FAILED"
    [[ -n ${CKPT_BENCH_RESULTS:-} ]] && printf 'bench smoke: %s\tfailed\tsee its log above\n' "$b" >>"$CKPT_BENCH_RESULTS"
  else
    [[ -n ${CKPT_BENCH_RESULTS:-} ]] && printf 'bench smoke: %s\tpassed\t\n' "$b" >>"$CKPT_BENCH_RESULTS"
  fi
  log "bench $b took $((SECONDS - start)) s"
done
if ((${#failed[@]})); then
  die "failed: ${failed[*]}"
fi
