#!/usr/bin/env bash
# Session 13, call 2: (1) the INT2 decode kernel of branch s13-decode-int2, round 1 (test, bench
# beside main's kernel); (2) TTFT and running streams' token gaps with the new GPU step defaults
# (chunk 8192, 8192 tokens a step, prefill step budget 2.5 decode steps), both caches.
set -u
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv | tee $OUT/device.txt
mkdir -p /tmp/d $OUT/dec && tar -xJf .peers/decode/bin.tar.xz -C /tmp/d
echo "== decode test"
LD_LIBRARY_PATH=/tmp/d/lib:$LD_LIBRARY_PATH timeout 150 /tmp/d/test_decode_attn_cuda --gtest_color=no > $OUT/dec/test.log 2>&1; echo test rc=$?
grep -E "^\[  (PASSED|FAILED)|Failure" $OUT/dec/test.log | head
echo "== decode bench ($(( $(date +%s) - t0 )) s)"
LD_LIBRARY_PATH=/tmp/d/lib:$LD_LIBRARY_PATH timeout 200 /tmp/d/bench_decode_attn_cuda --modes int2,int2c1,int2v3,bf16 --csv $OUT/dec/bench.csv > $OUT/dec/bench.log 2>&1; tail -45 $OUT/dec/bench.log
LD_LIBRARY_PATH=/tmp/d/lib:$LD_LIBRARY_PATH timeout 40 /tmp/d/bench_decode_attn_cuda --modes int2,int2v3 --ctx 131072 --batch 1,8 --sink 0 --recent 0 > $OUT/dec/bench_hist_only.log 2>&1; tail -8 $OUT/dec/bench_hist_only.log
echo "== ttft + itl, GPU defaults ($(( $(date +%s) - t0 )) s)"
mkdir -p /tmp/g && tar -xJf .gpu/bin.tar.xz -C /tmp/g
export LD_LIBRARY_PATH=/tmp/g/lib:$LD_LIBRARY_PATH
PREFILL_MODES="bf16 int2-hadamard" PREFILL_SHARED="" PREFILL_TORCH_LENS="" PREFILL_TIMEOUT=150 bash /tmp/g/gpu-check.sh prefill 2>&1 | grep -vE "^\s*$" | grep -v "Compute Mode\|Persistence\|MIG" | tail -14
grep -h "serve:" $OUT/prefill_serve_*.log | head -2
cd $OUT && tar -czf logs.tgz --remove-files dec *.log *.json 2>/dev/null; ls $OUT
echo "done ($(( $(date +%s) - t0 )) s)"
