#!/usr/bin/env bash
# Builds the CUDA tests and benchmarks and the oscar binary here (nvcc, no GPU needed) and packs
# them, with scripts/gpu-check.sh, into <checkout>/.gpu/bin.tar.xz for a device call (carry: .gpu,
# .peers).
#   scripts/gpu-pack.sh [build-dir] [dest-checkout]      (defaults: build-cuda, /work/main)
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build-cuda}
OUTDIR=${2:-/work/main}/.gpu
# Staged here, then sent as one xz tarball: the binaries carry every kernel's machine code and
# the checkout itself is ~49 MB of a 64 MiB transfer.
DEST=$(mktemp -d /tmp/oscar-gpu-stage.XXXX)
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-/work} CCACHE_DIR=${CCACHE_DIR:-/work/.ccache}
if [ ! -f "$B/build.ninja" ]; then
  cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DOSCAR_CUDA=ON -DOSCAR_BUILD_BENCH=ON \
    -DOSCAR_NATIVE=OFF -DCMAKE_CXX_FLAGS=-march=x86-64-v3 \
    -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
    -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache
fi
# The checkout is ~49 MB of the 64 MiB a call may carry, so a call packs what it runs (each
# engine-linked binary is ~3 MB compressed): GPU_TESTS / GPU_BENCHES override the lists.
TESTS=${GPU_TESTS:-"test_decode_attn_cuda test_ops_cuda test_demote_pages_cuda test_linear_cuda test_prefill_attn_cuda test_model_cuda test_golden"}
BENCHES=${GPU_BENCHES:-"bench_decode_attn_cuda bench_demote_cuda bench_linear_cuda bench_decode_step"}
cmake --build "$B" -j2 --target $TESTS $BENCHES oscar
mkdir -p "$DEST/lib" "$DEST/configs"
for t in $TESTS; do cp "$(find "$B/tests" -name "$t" -type f | head -1)" "$DEST/"; done
for b in $BENCHES; do cp "$B/bench/$b" "$DEST/"; done
cp "$B/apps/oscar" scripts/gpu-check.sh "$DEST/"
# Real model shapes for the dummy-weight step benchmark (a tokenizer is needed to build a runtime;
# the embedded model's serves, token ids are random there anyway).
for m in qwen3-8b qwen3-4b; do
  mkdir -p "$DEST/configs/$m"
  src="../shared/configs/$m.json"
  [ -f "$src" ] || src="/work/shared/configs/$m.json"
  # max_position_embeddings 131072: Qwen3's long-context setting (YaRN x4 on its 32K native
  # window, as its model card describes) for 100K-token runs; dummy weights, so only shapes matter.
  python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); c["max_position_embeddings"]=131072; json.dump(c,open(sys.argv[2],"w"),indent=1)' \
    "$src" "$DEST/configs/$m/config.json"
  cp models/tiny-qwen3/tokenizer.json models/tiny-qwen3/tokenizer_config.json "$DEST/configs/$m/"
done
# Non-CUDA shared libraries from this machine that the binaries need (CUDA's are on the device).
for bin in "$DEST"/test_* "$DEST"/bench_* "$DEST/oscar"; do
  ldd "$bin" | awk '/=>/ {print $3}' | grep -vE "libcuda|libcudart|libcublas|libc\.so|libm\.so|libdl|libpthread|librt|ld-linux|libstdc|libgcc_s" |
    while read -r lib; do [ -f "$lib" ] && cp -L "$lib" "$DEST/lib/"; done || true
done
strip "$DEST"/test_* "$DEST"/bench_* "$DEST/oscar"
rm -rf "$OUTDIR" && mkdir -p "$OUTDIR"
tar -C "$DEST" -cf - . | xz -T2 -9e > "$OUTDIR/bin.tar.xz"
cp scripts/gpu-check.sh "$OUTDIR/"
rm -rf "$DEST"
ls -la "$OUTDIR"
# A call carries at most 64 MiB: the tracked files, .gpu and .peers together.
tracked=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
carried=$(du -cb "$OUTDIR" "$(dirname "$OUTDIR")/.peers" 2>/dev/null | tail -1 | cut -f1)
total=$(( tracked + carried ))
echo "carry: $(( total / 1048576 )) MiB of 64 (checkout $(( tracked / 1048576 )) MiB)"
[ "$total" -le $(( 64 * 1048576 )) ] || echo "warning: over the 64 MiB a device call carries: pack fewer binaries (GPU_TESTS / GPU_BENCHES)" >&2
# On the device (carry .gpu and .peers):
#   mkdir -p /tmp/g && tar -xJf .gpu/bin.tar.xz -C /tmp/g && bash /tmp/g/gpu-check.sh test model
