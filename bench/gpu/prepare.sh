#!/usr/bin/env bash
# prepare.sh: on the build machine (Debian 12 with tools/setup.sh's packages
# and a CUDA toolkit, no GPU needed), makes everything the GPU check needs on
# a machine that has a GPU, torch, CMake and a compiler but no Debian
# development packages and no network (the lent GPU machine):
#
#   .gpu-kit/bin/       the GPU test binaries and gpu_bench (Release, CUDA on)
#   .gpu-kit/lib/       every shared library they need beyond the C and C++
#                       runtimes, libckpt.a (with the CUDA copier) and
#                       libcudart_static.a, for building the extension there
#   .gpu-kit/include/   the headers of libckpt's dependencies
#   .gpu-kit/prebuilt/  _ckpt_torch.so built here against torch
#                       $CKPT_DEVICE_TORCH (default 2.11.0, the device's), from
#                       a venv that has that version: the fallback if the
#                       build there fails
#
# .gpu-kit/ is git-ignored; name it in the device tool's `carry` and run
# bench/gpu/check.sh there. Build trees: build-gpu/, build-gpu-ext/.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
kit=$repo/.gpu-kit
device_torch=${CKPT_DEVICE_TORCH:-2.11.0}
venv=${CKPT_DEVICE_TORCH_VENV:-/opt/torch-$device_torch}
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)

echo "== prepare: libckpt and the GPU binaries (Release, CUDA on)" >&2
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCKPT_WITH_CUDA=ON -DCKPT_BUILD_TORCH=OFF \
  -DCKPT_BUILD_TOOLS=OFF "${launcher[@]}" >/dev/null
bins=(cuda_stager_test device_staging_test async_engine_test copy_coalescer_test gpu_bench)
cmake --build build-gpu -j"$(nproc)" --target ckpt "${bins[@]}"

rm -rf "$kit" && mkdir -p "$kit/bin" "$kit/lib" "$kit/include" "$kit/prebuilt"
for b in "${bins[@]}"; do
  f=$(find build-gpu -name "$b" -type f -perm -u+x | head -1)
  cp "$f" "$kit/bin/"
done
# Shared libraries beyond libc/libm/libstdc++/libgcc_s and the loader (the
# device's own are newer and serve).
for b in "$kit"/bin/*; do
  ldd "$b" | awk '/=> \//{print $3}'
done | sort -u | while read -r lib; do
  case $(basename "$lib") in
    libc.so*|libm.so*|libstdc++.so*|libgcc_s.so*|ld-linux*|libpthread.so*|libdl.so*|librt.so*) ;;
    *) cp -L "$lib" "$kit/lib/" ;;
  esac
done
# For the extension's build there: the library, CUDA's static runtime, the
# dependencies' headers and every Abseil library (the extension links more
# of them than the binaries do).
cp build-gpu/libckpt/libckpt.a "$kit/lib/"
cp /usr/local/cuda/lib64/libcudart_static.a "$kit/lib/"
for lib in /usr/lib/x86_64-linux-gnu/libabsl_*.so.* /usr/lib/x86_64-linux-gnu/liburing.so.2* \
           /usr/lib/x86_64-linux-gnu/libzstd.so.1* /usr/lib/x86_64-linux-gnu/libxxhash.so.0*; do
  cp -P --remove-destination "$lib" "$kit/lib/"  # (symlinks stay links: each library once)
done
# Unversioned names for the linker there.
(cd "$kit/lib" && for f in *.so.*; do base=${f%%.so.*}.so; [[ -e $base ]] || ln -s "$f" "$base"; done)
cp -r /usr/include/absl /usr/include/nlohmann /usr/include/liburing /usr/include/liburing.h \
      /usr/include/zstd.h /usr/include/zstd_errors.h /usr/include/xxhash.h "$kit/include/"

echo "== prepare: the extension against torch $device_torch (fallback for the device)" >&2
if ! [[ -x $venv/bin/python ]] || ! "$venv/bin/python" -c "import torch.utils" >/dev/null 2>&1; then
  python3 -m venv --system-site-packages "$venv"
fi
site=$(python3 -c 'import site; print(site.getsitepackages()[0])')
nv=$site/nvidia
export LD_LIBRARY_PATH=$nv/cu13/lib:$nv/cudnn/lib:$nv/nccl/lib:$nv/nvshmem/lib:$nv/cusparselt/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
if [[ $("$venv/bin/python" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null) != "$device_torch" ]]; then
  "$venv/bin/pip" install --quiet --no-deps "torch==$device_torch"
fi
cmake -S bench/gpu/ext -B build-gpu-ext -G Ninja -DCKPT_KIT="$kit" -DCKPT_PYTHON="$venv/bin/python" \
  "${launcher[@]}" >/dev/null
cmake --build build-gpu-ext -j"$(nproc)"
cp build-gpu-ext/_ckpt_torch.so "$kit/prebuilt/"
echo "$device_torch" > "$kit/prebuilt/TORCH_VERSION"
du -sh "$kit" >&2
echo "== prepare: done; carry .gpu-kit and run: bash bench/gpu/check.sh" >&2
