#!/usr/bin/env bash
# Builds the CUDA test and benchmark here (nvcc, no GPU needed) and copies them, with
# scripts/gpu-check.sh, into <checkout>/.gpu/ for a device call (carry: .gpu, .peers).
#   scripts/gpu-pack.sh [build-dir] [dest-checkout]      (defaults: build-cuda, /work/main)
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build-cuda}
DEST=${2:-/work/main}/.gpu
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-/work} CCACHE_DIR=${CCACHE_DIR:-/work/.ccache}
if [ ! -f "$B/build.ninja" ]; then
  cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DOSCAR_CUDA=ON -DOSCAR_BUILD_BENCH=ON \
    -DOSCAR_NATIVE=OFF -DOSCAR_BUILD_SERVER=OFF -DCMAKE_CXX_FLAGS=-march=x86-64-v3 \
    -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
    -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache
fi
cmake --build "$B" -j2 --target test_decode_attn_cuda bench_decode_attn_cuda
mkdir -p "$DEST/lib"
cp "$B/tests/kernels/test_decode_attn_cuda" "$B/bench/bench_decode_attn_cuda" scripts/gpu-check.sh "$DEST/"
# Non-CUDA shared libraries from this machine that the binaries need (CUDA's are on the device).
for bin in "$DEST/test_decode_attn_cuda" "$DEST/bench_decode_attn_cuda"; do
  ldd "$bin" | awk '/=>/ {print $3}' | grep -vE "libcuda|libcudart|libc\.so|libm\.so|libdl|libpthread|librt|ld-linux|libstdc|libgcc_s" |
    while read -r lib; do [ -f "$lib" ] && cp -L "$lib" "$DEST/lib/"; done
done
ls -la "$DEST" "$DEST/lib"
