#!/usr/bin/env bash
# Session 15, call 2: the Qwen3-Next golden again (call 1's script stopped at an attribute
# transformers 5.17 lacks); why an 8K chunk's attention runs at 404 TFLOP/s at depth 94K
# (call 1, H100) against 533 over 24K in the kernel benchmark: the whole step at both depths by
# phase, and the L2 hit rate and DRAM bytes of one layer's attention kernel at each (ncu).
set -u
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
t0=$(date +%s)
el() { echo "($(( $(date +%s) - t0 )) s)"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv | tee $OUT/device.txt
mkdir -p /tmp/g && tar -xJf .gpu/bin.tar.xz -C /tmp/g
G=/tmp/g
export LD_LIBRARY_PATH=/tmp/g/lib:$LD_LIBRARY_PATH
echo "== Qwen3-Next golden $(el)"
timeout 100 python3 scripts/goldens/qwen3_next_golden.py --out $OUT/qwen3_next_golden.safetensors \
  > $OUT/golden_next.log 2>&1; echo rc=$?; tail -8 $OUT/golden_next.log
for ctx in 24576 94208; do
  echo "== an 8K chunk over $ctx, by phase $(el)"
  timeout 60 $G/bench_decode_step --model $G/configs/qwen3-8b --dummy-weights --device cuda \
    --modes bf16 --context $ctx --batches 1 --chunk 8192 --steps 2 --phases > $OUT/phases_$ctx.log 2>&1
  grep -E "GPU time" $OUT/phases_$ctx.log | head -2
done
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for ctx in 24576 94208; do
  echo "== ncu: layer attention of an 8K chunk over $ctx $(el)"
  timeout 90 $NCU --clock-control none -k regex:prefill_attn_ws_kernel --launch-skip 40 --launch-count 1 \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,lts__t_sector_hit_rate.pct,sm__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_bytes.sum \
    $G/bench_decode_step --model $G/configs/qwen3-8b --dummy-weights --device cuda --no-graphs \
    --modes bf16 --context $ctx --batches 1 --chunk 8192 --steps 2 > $OUT/ncu_$ctx.log 2>&1
  echo "ncu rc=$?"; grep -E "prefill_attn_ws|duration|dram__|lts__|sm__" $OUT/ncu_$ctx.log | head -8
done
cd $OUT && tar -czf logs.tgz --remove-files *.log 2>/dev/null; ls $OUT
echo "done $(el)"
