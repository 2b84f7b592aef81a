#!/usr/bin/env bash
# The README's main job. Installs what it needs (tools/setup.sh: apt, and
# PyTorch 2.x from PyPI into the `python3` on PATH), builds everything (the
# library, ckpt-restore, ckpt-retain, the LibTorch extension against that
# torch), installs the tools and the `ckpt` Python package with
# `cmake --install` (tools into ${CKPT_PREFIX:-/usr/local}/bin, the package
# into that python3's site-packages, so afterwards `python3 -c "import ckpt"`
# and `ckpt-restore` work from anywhere), then runs
# torch_ext/examples/train_resume.py: a small transformer trained with
# asynchronous exact-delta checkpoints, killed with SIGKILL, recovered with
# `ckpt-restore --latest --verify` and ckpt.load, and resumed, then preempted
# with SIGTERM (a final save, a clean exit) and resumed again; it exits 0 only
# if both resumed runs' losses and final state equal the uninterrupted run's.
# Idempotent: apt and pip run only for what is missing, the build is
# incremental, the install overwrites, the demo works in a fresh temp dir.
# Arguments are passed to train_resume.py (e.g. --steps 60 --work DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
build_dir=${CKPT_BUILD_DIR:-build}
prefix=${CKPT_PREFIX:-/usr/local}
python=$(sed -n 's/^CKPT_PYTHON:[A-Z]*=//p' "$build_dir/CMakeCache.txt")

if [[ ! -f $build_dir/torch_ext/_ckpt_torch.so ]]; then
  echo "main: the LibTorch extension was not built (no torch in ${python:-python3}?)" >&2
  exit 1
fi
SUDO=""
[[ $(id -u) -ne 0 ]] && SUDO="sudo"
$SUDO cmake --install "$build_dir" --prefix "$prefix" >/dev/null

export PATH="$prefix/bin:$PATH"
(cd / && "$python" -c "import ckpt, sys, torch; print('main: ckpt', ckpt.__version__, 'from', ckpt.__file__, '; torch', torch.__version__, '; extension', ckpt.library_path(), file=sys.stderr)")
echo "main: ckpt-restore is $(command -v ckpt-restore)" >&2

export CKPT_LOG=${CKPT_LOG:-warning}
exec "$python" torch_ext/examples/train_resume.py "$@"
