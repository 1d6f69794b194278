#!/usr/bin/env bash
# Session 13, call 3 (final): the merged main (INT2 expansion, for_each_work, the CUDA
# deterministic mode, the step runner): correctness; the INT2 decode kernel's round 2
# (branch s13-decode-int2); the prefill kernel quick bench; TTFT at the old and new GPU chunking.
set -u
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
t0=$(date +%s)
el() { echo "($(( $(date +%s) - t0 )) s)"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv | tee $OUT/device.txt
mkdir -p /tmp/g && tar -xJf .gpu/bin.tar.xz -C /tmp/g
G=/tmp/g
export LD_LIBRARY_PATH=/tmp/g/lib:$LD_LIBRARY_PATH
echo "== test_prefill_attn_cuda $(el)"
timeout 120 $G/test_prefill_attn_cuda --gtest_color=no > $OUT/test_prefill.log 2>&1; echo rc=$?
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|non-finite|mismatch" $OUT/test_prefill.log | head -8
echo "== batch-invariant kernels $(el)"
timeout 60 $G/test_linear_cuda --gtest_color=no --gtest_filter='*BatchInvariant*' > $OUT/test_linear_det.log 2>&1; echo rc=$?; grep -E "^\[  (PASSED|FAILED) |Failure" $OUT/test_linear_det.log | head -3
timeout 60 $G/test_decode_attn_cuda --gtest_color=no --gtest_filter='*BatchInvariant*' > $OUT/test_decode_det.log 2>&1; echo rc=$?; grep -E "^\[  (PASSED|FAILED) |Failure" $OUT/test_decode_det.log | head -3
echo "== model $(el)"
timeout 150 bash $G/gpu-check.sh model 2>&1 | grep -E "PASSED|FAILED|Failure|max_abs|identical|rc=" | head -20
echo "== INT2 decode round 2 (s13-decode-int2) $(el)"
mkdir -p /tmp/d $OUT/dec && tar -xJf .peers/decode/bin.tar.xz -C /tmp/d && cat /tmp/d/COMMIT
LD_LIBRARY_PATH=/tmp/d/lib:/usr/local/cuda/lib64 timeout 90 /tmp/d/test_decode_attn_cuda --gtest_color=no > $OUT/dec/test.log 2>&1; echo test rc=$?
grep -E "^\[  (PASSED|FAILED)|Failure" $OUT/dec/test.log | head -4
LD_LIBRARY_PATH=/tmp/d/lib:/usr/local/cuda/lib64 timeout 100 /tmp/d/bench_decode_attn_cuda --modes int2,int2sp,int2v3 --csv $OUT/dec/bench.csv > $OUT/dec/bench.log 2>&1; grep -E "^\| int2" $OUT/dec/bench.log | cut -d'|' -f2-4,8,13-14
LD_LIBRARY_PATH=/tmp/d/lib:/usr/local/cuda/lib64 timeout 30 /tmp/d/bench_decode_attn_cuda --modes int2,int2v3,bf16 --ctx 1024 --batch 1,8 --iters 30 > $OUT/dec/bench_floor.log 2>&1; tail -7 $OUT/dec/bench_floor.log
echo "== prefill bench, auto $(el)"
timeout 60 $G/bench_prefill_attn_cuda --quick --path auto > $OUT/bench_prefill.log 2>&1; grep -E "^\|" $OUT/bench_prefill.log
echo "== TTFT: chunk 512 / 1024 against the GPU default 8192 / 8192, bf16 $(el)"
PREFILL_MODES=bf16 PREFILL_CHUNK=512 PREFILL_MBT=1024 PREFILL_TTFT=8192,32768 PREFILL_SHARED= PREFILL_ITL= PREFILL_TORCH_LENS= PREFILL_TIMEOUT=60 timeout 100 bash $G/gpu-check.sh prefill 2>&1 | grep -E '"tokens"'
PREFILL_MODES=bf16 PREFILL_TTFT=8192,32768 PREFILL_SHARED= PREFILL_ITL= PREFILL_TORCH_LENS= PREFILL_TIMEOUT=60 timeout 100 bash $G/gpu-check.sh prefill 2>&1 | grep -E '"tokens"'
cd $OUT && tar -czf logs.tgz --remove-files dec *.log *.json 2>/dev/null; ls $OUT
echo "done $(el)"
