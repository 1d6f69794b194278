#!/usr/bin/env bash
# Session 14, call 2: the running streams' token gaps during a 100K prefill (8 streams decoding,
# then one 102400-token prompt) with the step budget (serve --prefill-itl-factor 2.5) and the key
# split of short chunks at depth on the serving path (OSCAR_PREFILL_SPLIT=1), both caches.
set -u
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
t0=$(date +%s)
el() { echo "($(( $(date +%s) - t0 )) s)"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv | tee $OUT/device.txt
mkdir -p /tmp/g && tar -xJf .gpu/bin.tar.xz -C /tmp/g
G=/tmp/g
export LD_LIBRARY_PATH=/tmp/g/lib:$LD_LIBRARY_PATH
echo "== branch bi-linear: the batch-invariant tensor-core GEMM (issue #24) $(el)"
mkdir -p /tmp/bil && tar -xJf .gpu/bil.tar.xz -C /tmp/bil
LD_LIBRARY_PATH=/tmp/bil/lib:$LD_LIBRARY_PATH timeout 150 /tmp/bil/test_linear_cuda --gtest_color=no \
  --gtest_filter='LinearCuda.*' > $OUT/test_linear_bil.log 2>&1; echo rc=$?
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|err/tol|mismatch" $OUT/test_linear_bil.log | head -16
LD_LIBRARY_PATH=/tmp/bil/lib:$LD_LIBRARY_PATH timeout 120 /tmp/bil/bench_linear_cuda \
  > $OUT/bench_linear_bil.log 2>&1; echo rc=$?
cat $OUT/bench_linear_bil.log | head -70
echo "== ITL during a 100K prefill, step budget 2.5, split on $(el)"
OSCAR_PREFILL_SPLIT=1 PREFILL_ITL_FACTOR=2.5 PREFILL_TTFT=8192 PREFILL_SHARED= PREFILL_TORCH_LENS= \
  PREFILL_TIMEOUT=150 timeout 400 bash $G/gpu-check.sh prefill 2>&1 | grep -E '"tokens"|"streams"|== prefill|ttft|itl'
grep -h "serve:" $OUT/prefill_serve_*.log | head -2
cd $OUT && tar -czf logs.tgz --remove-files *.log *.json 2>/dev/null; ls $OUT
echo "done $(el)"
