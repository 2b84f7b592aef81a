#!/usr/bin/env bash
# The README's test command: installs dependencies, builds, runs every test.
# CKPT_TEST_LABEL_EXCLUDE=slow skips the slow suites.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
build_dir=${CKPT_BUILD_DIR:-build}
exclude=()
[[ -n ${CKPT_TEST_LABEL_EXCLUDE:-} ]] && exclude=(-LE "$CKPT_TEST_LABEL_EXCLUDE")
CKPT_LOG=${CKPT_LOG:-warning} ctest --test-dir "$build_dir" -j2 --output-on-failure --timeout 900 "${exclude[@]}"
