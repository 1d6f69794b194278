#!/usr/bin/env bash
# Session 15, call 1 (the device was scarce: one call of what matters most, each step behind a
# time guard): the Qwen3-Next golden (branch qwen3-next, issue #25); the prefill key split of
# short chunks at depth (session 14's code: correctness, kernel auto vs split, a 256-token chunk
# at depth 94K through the whole step, split off / on, the model tests with the split on); the
# batch-invariant tensor-core GEMM (branch bi-linear, issue #24: its tests and benchmark); then,
# if time is left, a 100K prompt's last 8K chunk by phase.
set -u
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
t0=$(date +%s)
el() { echo "($(( $(date +%s) - t0 )) s)"; }
before() { [ $(( $(date +%s) - t0 )) -lt "$1" ]; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv | tee $OUT/device.txt
mkdir -p /tmp/g /tmp/bil && tar -xJf .gpu/bin.tar.xz -C /tmp/g && tar -xJf .gpu/bil.tar.xz -C /tmp/bil
G=/tmp/g
export LD_LIBRARY_PATH=/tmp/g/lib:$LD_LIBRARY_PATH
echo "== Qwen3-Next golden (CPU torch, float32) $(el)"
timeout 100 python3 scripts/goldens/qwen3_next_golden.py --out $OUT/qwen3_next_golden.safetensors \
  > $OUT/golden_next.log 2>&1; echo rc=$?; tail -8 $OUT/golden_next.log
echo "== test_prefill_attn_cuda $(el)"
timeout 150 $G/test_prefill_attn_cuda --gtest_color=no > $OUT/test_prefill.log 2>&1; echo rc=$?
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|non-finite|mismatch" $OUT/test_prefill.log | head -12
grep -E "split" $OUT/test_prefill.log | head -6
echo "== bi-linear: test_linear_cuda $(el)"
LD_LIBRARY_PATH=/tmp/bil/lib:$LD_LIBRARY_PATH timeout 90 /tmp/bil/test_linear_cuda --gtest_color=no \
  --gtest_filter='LinearCuda.*' > $OUT/test_linear_bil.log 2>&1; echo rc=$?
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|err/tol|mismatch" $OUT/test_linear_bil.log | head -14
echo "== bi-linear: bench_linear_cuda $(el)"
LD_LIBRARY_PATH=/tmp/bil/lib:$LD_LIBRARY_PATH timeout 70 /tmp/bil/bench_linear_cuda \
  > $OUT/bench_linear_bil.log 2>&1; echo rc=$?; head -60 $OUT/bench_linear_bil.log
echo "== prefill kernel, auto vs split $(el)"
timeout 60 $G/bench_prefill_attn_cuda --quick --path auto > $OUT/bench_auto.log 2>&1
timeout 60 $G/bench_prefill_attn_cuda --quick --path split > $OUT/bench_split.log 2>&1
grep -E "^\|" $OUT/bench_auto.log; grep -E "^\| [0-9]" $OUT/bench_split.log
for sp in 0 1; do
  before 420 || break
  echo "== a 256-token chunk at depth 94K, OSCAR_PREFILL_SPLIT=$sp $(el)"
  OSCAR_PREFILL_SPLIT=$sp timeout 70 $G/bench_decode_step --model $G/configs/qwen3-8b --dummy-weights \
    --device cuda --modes bf16,int2-hadamard --context 94208 --batches 1 --chunk 256 --steps 4 \
    > $OUT/chunk256_split$sp.log 2>&1
  grep -E "^\|" $OUT/chunk256_split$sp.log | head -6
done
if before 470; then
  echo "== test_model_cuda with OSCAR_PREFILL_SPLIT=1 $(el)"
  OSCAR_PREFILL_SPLIT=1 timeout 90 $G/test_model_cuda --gtest_color=no > $OUT/test_model_split.log 2>&1
  echo rc=$?; grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure" $OUT/test_model_split.log | head -12
fi
if before 490; then
  echo "== the last 8K chunk of a 100K prompt, by phase $(el)"
  timeout 90 $G/bench_decode_step --model $G/configs/qwen3-8b --dummy-weights --device cuda \
    --modes bf16 --context 94208 --batches 1 --chunk 8192 --steps 2 --phases > $OUT/phases.log 2>&1
  grep -E "^\||GPU time" $OUT/phases.log | head -30
fi
cd $OUT && tar -czf logs.tgz --remove-files *.log 2>/dev/null; ls $OUT
echo "done $(el)"
