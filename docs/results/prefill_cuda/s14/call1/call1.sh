#!/usr/bin/env bash
# Session 14, call 1: the warp-specialised prefill kernel's key split (short chunks at depth):
# correctness, the kernel benchmark with and without the split, where a 100K prompt's last 8K
# chunk spends its time, and the model checks. Call 2: the running streams' token gaps during a
# 100K prefill with the step budget.
set -u
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
t0=$(date +%s)
el() { echo "($(( $(date +%s) - t0 )) s)"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv | tee $OUT/device.txt
mkdir -p /tmp/g && tar -xJf .gpu/bin.tar.xz -C /tmp/g
G=/tmp/g
export LD_LIBRARY_PATH=/tmp/g/lib:$LD_LIBRARY_PATH
echo "== Qwen3-Next golden (branch qwen3-next, issue #25; CPU torch, float32) $(el)"
timeout 150 python3 scripts/goldens/qwen3_next_golden.py --out $OUT/qwen3_next_golden.safetensors \
  > $OUT/golden_next.log 2>&1; echo rc=$?; tail -12 $OUT/golden_next.log
echo "== test_prefill_attn_cuda $(el)"
timeout 150 $G/test_prefill_attn_cuda --gtest_color=no > $OUT/test_prefill.log 2>&1; echo rc=$?
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|non-finite|mismatch|max err" $OUT/test_prefill.log | head -12
echo "== prefill bench, auto vs split $(el)"
timeout 150 $G/bench_prefill_attn_cuda --quick --path auto > $OUT/bench_auto.log 2>&1
timeout 150 $G/bench_prefill_attn_cuda --quick --path split > $OUT/bench_split.log 2>&1
grep -E "^\|" $OUT/bench_auto.log; grep -E "^\| [0-9]" $OUT/bench_split.log
echo "== the last 8K chunk of a 100K prompt, by phase $(el)"
timeout 120 $G/bench_decode_step --model $G/configs/qwen3-8b --dummy-weights --device cuda \
  --modes bf16,int2-hadamard --context 94208 --batches 1 --chunk 8192 --steps 3 > $OUT/chunk_step.log 2>&1
grep -E "^\|" $OUT/chunk_step.log | head -8
timeout 120 $G/bench_decode_step --model $G/configs/qwen3-8b --dummy-weights --device cuda \
  --modes bf16,int2-hadamard --context 94208 --batches 1 --chunk 8192 --steps 2 --phases > $OUT/phases.log 2>&1
grep -E "^\||GPU time" $OUT/phases.log | head -40
echo "== a 256-token chunk at depth 94K (the step budget's chunks), split off / on $(el)"
for sp in 0 1; do
  OSCAR_PREFILL_SPLIT=$sp timeout 100 $G/bench_decode_step --model $G/configs/qwen3-8b --dummy-weights \
    --device cuda --modes bf16,int2-hadamard --context 94208 --batches 1 --chunk 256 --steps 4 \
    > $OUT/chunk256_split$sp.log 2>&1
  echo "split=$sp"; grep -E "^\|" $OUT/chunk256_split$sp.log | head -6
done
echo "== model $(el)"
timeout 150 bash $G/gpu-check.sh model 2>&1 | grep -E "PASSED|FAILED|Failure|max_abs|rc=" | head -20
echo "== ncu: the warp-specialised kernel on 1 x 8K (case 0) $(el)"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
timeout 150 $NCU --clock-control none -k regex:prefill_attn_ws_kernel --launch-skip 2 --launch-count 1 \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
  --section SchedulerStats --section MemoryWorkloadAnalysis --section Occupancy \
  $G/bench_prefill_attn_cuda --case 0 --path auto --iters 1 > $OUT/ncu_ws_8k.log 2>&1
echo "ncu rc=$?"
grep -E "Throughput|Issue|Stall|Eligible|Active Warps|Duration|Registers|Pipe|Executed Ipc" $OUT/ncu_ws_8k.log | head -40
cd $OUT && tar -czf logs.tgz --remove-files *.log *.json 2>/dev/null; ls $OUT
echo "done $(el)"
