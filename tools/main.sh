#!/usr/bin/env bash
# The README's main job: builds everything, then runs a training-like loop
# that checkpoints every few steps, "crashes", and restores the newest
# checkpoint, checking it bit for bit.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
build_dir=${CKPT_BUILD_DIR:-build}
root=${CKPT_DEMO_ROOT:-$build_dir/demo-checkpoints}
rm -rf "$root"
"$build_dir/libckpt/train_and_restore" --root "$root" "$@"
"$build_dir/tools/ckpt-restore" --root "$root" --list || true
"$build_dir/tools/ckpt-restore" --root "$root" --latest --verify || true
