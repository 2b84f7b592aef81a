#!/usr/bin/env bash
# Installs what ckpt needs to build and test — Debian 12's apt packages and,
# into the `python3` on PATH, PyTorch 2.x and the test packages from PyPI
# (idempotent: apt and pip run only for what is missing) — then configures
# and builds the project into ${CKPT_BUILD_DIR:-build} with -j2.
#   tools/setup.sh [--deps-only]   --deps-only: install, do not build
#                                  (tools/test.sh builds as a stage of its own)
set -euo pipefail
cd "$(dirname "$0")/.."
deps_only=0
[[ ${1:-} == --deps-only ]] && deps_only=1

packages=(cmake ninja-build g++ pkg-config liburing-dev libzstd-dev libxxhash-dev libabsl-dev
          libgtest-dev libgmock-dev nlohmann-json3-dev
          libcurl4-openssl-dev libssl-dev libexpat1-dev fio python3-matplotlib clang gdb ccache)
SUDO=""
[[ $(id -u) -ne 0 ]] && SUDO="sudo"
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >&2
fi

# Python packages, into the `python3` first on PATH (the one users and the
# tests use): PyTorch 2.x from PyPI and what the tests need. pip runs only
# for what is missing (the first torch install is a large download).
python=$(command -v python3) || { echo "setup: no python3 on PATH" >&2; exit 1; }
python=$("$python" -c 'import sys; print(sys.executable)')
# The integrations' tests (tests/python/test_lightning.py, test_hf.py) need
# Lightning (both packages: `lightning` and the standalone
# `pytorch_lightning`), transformers and accelerate (transformers' Trainer).
pip_missing=()
for module in torch numpy pytest safetensors lightning pytorch_lightning transformers accelerate; do
  "$python" -c "import $module" 2>/dev/null || pip_missing+=("$module")
done
# The object tier's tests run moto's S3 server (and boto3 as the reference
# client of bench/object_tier_bench): without them those tests fail.
"$python" -c "import moto.server, flask, flask_cors, boto3" 2>/dev/null ||
  pip_missing+=("moto[server]" boto3)
if ((${#pip_missing[@]})); then
  echo "setup: pip installing ${pip_missing[*]} into $python" >&2
  if ! "$python" -m pip --version >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-pip >&2
  fi
  # A Debian-managed interpreter refuses plain installs (PEP 668).
  "$python" -m pip install --quiet "${pip_missing[@]}" ||
    "$python" -m pip install --quiet --break-system-packages "${pip_missing[@]}"
fi

((deps_only)) && exit 0

build_dir=${CKPT_BUILD_DIR:-build}
build_type=${CKPT_BUILD_TYPE:-RelWithDebInfo}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE="$build_type" -DCKPT_PYTHON="$python" >/dev/null
cmake --build "$build_dir" -j2
