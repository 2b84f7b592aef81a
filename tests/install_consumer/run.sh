#!/usr/bin/env bash
# Installs the build tree $1 into a scratch prefix, builds the consumer
# project against it with find_package(ckpt), and runs it.
set -euo pipefail
build=$1
src=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/build" >/dev/null
"$work/build/consumer" "$work/root"
echo "consumer built against $work/prefix and round-tripped a tensor"
