#!/usr/bin/env bash
# Installs what ckpt needs to build and test from Debian 12's apt (idempotent:
# apt is only called when a package is missing), then configures and builds
# the project into ${CKPT_BUILD_DIR:-build} with -j2.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(cmake ninja-build g++ pkg-config liburing-dev libzstd-dev libxxhash-dev libabsl-dev
          libgtest-dev libgmock-dev nlohmann-json3-dev fio
          libtorch-dev python3-torch python3-pytest python3-matplotlib)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >&2
fi

build_dir=${CKPT_BUILD_DIR:-build}
build_type=${CKPT_BUILD_TYPE:-RelWithDebInfo}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE="$build_type" >/dev/null
cmake --build "$build_dir" -j2
