#!/usr/bin/env bash
# The README's test command: installs dependencies, builds, runs every test
# (GoogleTest suites incl. the slow ones, the Python suites when LibTorch is
# present), then the engine suites again under ThreadSanitizer.
#   CKPT_TEST_LABEL_EXCLUDE=slow   skip the slow suites
#   CKPT_SKIP_TSAN=1               skip the ThreadSanitizer pass
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
build_dir=${CKPT_BUILD_DIR:-build}
exclude=()
[[ -n ${CKPT_TEST_LABEL_EXCLUDE:-} ]] && exclude=(-LE "$CKPT_TEST_LABEL_EXCLUDE")
export CKPT_LOG=${CKPT_LOG:-warning}
ctest --test-dir "$build_dir" -j2 --output-on-failure --timeout 900 "${exclude[@]}"

if [[ ${CKPT_SKIP_TSAN:-0} != 1 ]]; then
  # Debian's Abseil is not TSAN-instrumented; ckpt's own locks are std::mutex
  # based (util/mutex.h), so reports here are real.
  tsan_dir=${CKPT_TSAN_BUILD_DIR:-build-tsan}
  tsan_tests=(async_engine_test engine_test delta_test device_staging_test stall_timeout_test
              encoder_buffers_test staging_copy_test)
  cmake -S . -B "$tsan_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCKPT_TSAN=ON \
    -DCKPT_BUILD_BENCH=OFF -DCKPT_BUILD_TOOLS=OFF -DCKPT_BUILD_TORCH=OFF -DCKPT_WITH_CUDA=OFF >/dev/null
  cmake --build "$tsan_dir" -j2 --target "${tsan_tests[@]}"
  for t in "${tsan_tests[@]}"; do
    echo "== ThreadSanitizer: $t"
    TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" "$tsan_dir/tests/$t" --gtest_brief=1
  done
fi
