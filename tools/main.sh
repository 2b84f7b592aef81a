#!/usr/bin/env bash
# The README's main job. Builds everything (the library, ckpt-restore, the
# LibTorch extension), installs ckpt-restore and the `ckpt` Python package
# with `cmake --install` into ${CKPT_PREFIX:-/usr/local} (so that afterwards
# `/usr/bin/python3 -c "import ckpt"` and `ckpt-restore` work from anywhere),
# then runs torch_ext/examples/train_resume.py: a small transformer trained
# with asynchronous exact-delta checkpoints, killed with SIGKILL, recovered
# with `ckpt-restore --latest --verify` and ckpt.load, and resumed; it exits 0
# only if the resumed losses and final state equal the uninterrupted run's.
# Idempotent: apt runs only for missing packages, the build is incremental,
# the install overwrites, the demo works in a fresh temp dir.
# Arguments are passed to train_resume.py (e.g. --steps 60 --work DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
build_dir=${CKPT_BUILD_DIR:-build}
prefix=${CKPT_PREFIX:-/usr/local}

if [[ ! -f $build_dir/torch_ext/_ckpt_torch.so ]]; then
  echo "main: the LibTorch extension was not built (CKPT_BUILD_TORCH=AUTO found no LibTorch?)" >&2
  exit 1
fi
SUDO=""
[[ $(id -u) -ne 0 ]] && SUDO="sudo"
$SUDO cmake --install "$build_dir" --prefix "$prefix" >/dev/null

# Where the package went: CKPT_PYTHON_INSTALL_DIR, relative to the prefix.
pydir=$(sed -n 's/^CKPT_PYTHON_INSTALL_DIR:[A-Z]*=//p' "$build_dir/CMakeCache.txt")
[[ $pydir == /* ]] || pydir="$prefix/$pydir"
export PATH="$prefix/bin:$PATH"
if ! (cd / && /usr/bin/python3 -c "import ckpt" 2>/dev/null); then
  export PYTHONPATH="$pydir${PYTHONPATH:+:$PYTHONPATH}"  # a prefix off /usr/bin/python3's sys.path
fi
(cd / && /usr/bin/python3 -c "import ckpt, sys; print('main: ckpt', ckpt.__version__, 'from', ckpt.__file__, '; extension', ckpt.library_path(), file=sys.stderr)")
echo "main: ckpt-restore is $(command -v ckpt-restore)" >&2

export CKPT_LOG=${CKPT_LOG:-warning}
exec /usr/bin/python3 torch_ext/examples/train_resume.py "$@"
