#!/usr/bin/env bash
# Session 13, call 1: INT2 history expanded to BF16 pages + the warp-specialised kernel:
# correctness, kernel benchmark beside the tiled kernel, whole-model tests, TTFT and the
# shared-prefix load test for both caches beside PyTorch.
set -u
mkdir -p /tmp/g && tar -xJf .gpu/bin.tar.xz -C /tmp/g
export LD_LIBRARY_PATH=/tmp/g/lib:${LD_LIBRARY_PATH:-}
G=/tmp/g
CUBLAS=$(ls /usr/local/cuda/lib64/libcublasLt.so.13 2>/dev/null || find /usr/local /opt -name libcublasLt.so.13 2>/dev/null | head -1)
[ -n "$CUBLAS" ] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(dirname "$CUBLAS")"
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv | tee $OUT/device.txt
echo "== test_prefill_attn_cuda"
timeout 150 $G/test_prefill_attn_cuda --gtest_color=no > $OUT/test_prefill.log 2>&1; echo rc=$?
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|non-finite|mismatch" $OUT/test_prefill.log | head -12
grep -E "^  auto" $OUT/test_prefill.log | sort -t= -k3 -g | tail -3
echo "== bench quick, all paths ($(( $(date +%s) - t0 )) s)"
timeout 200 $G/bench_prefill_attn_cuda --quick > $OUT/bench.log 2>&1; grep -E "^\|" $OUT/bench.log
echo "== model ($(( $(date +%s) - t0 )) s)"
bash $G/gpu-check.sh model 2>&1 | tail -12
echo "== ttft + shared ($(( $(date +%s) - t0 )) s)"
PREFILL_MODES="int2-hadamard bf16" PREFILL_ITL="" PREFILL_TIMEOUT=200 bash $G/gpu-check.sh prefill 2>&1 | grep -vE "^\s*$" | grep -v "Compute Mode\|Persistence\|MIG" | tail -24
cd $OUT && tar -czf logs.tgz --remove-files *.log *.json 2>/dev/null; ls $OUT
echo "done ($(( $(date +%s) - t0 )) s)"
