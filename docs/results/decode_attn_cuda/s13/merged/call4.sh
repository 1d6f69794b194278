#!/usr/bin/env bash
# Session 13, call 4: main after merging the INT2 decode branch (packed pairs) over the CUDA
# deterministic mode: the decode kernel's whole test, its bench beside main's old kernel, and the
# whole-model test.
set -u
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.sm --format=csv | tee $OUT/device.txt
mkdir -p /tmp/g && tar -xJf .gpu/bin.tar.xz -C /tmp/g
export LD_LIBRARY_PATH=/tmp/g/lib:$LD_LIBRARY_PATH
timeout 100 /tmp/g/test_decode_attn_cuda --gtest_color=no > $OUT/test_decode.log 2>&1; echo "decode test rc=$? ($(( $(date +%s) - t0 )) s)"
grep -E "^\[  (PASSED|FAILED)|Failure" $OUT/test_decode.log | head -4
timeout 60 /tmp/g/test_model_cuda --gtest_color=no > $OUT/test_model.log 2>&1; echo "model test rc=$? ($(( $(date +%s) - t0 )) s)"
grep -E "^\[  (PASSED|FAILED)|Failure" $OUT/test_model.log | head -4
timeout 60 /tmp/g/bench_decode_attn_cuda --modes int2,int2v3 --ctx 32768,131072 --batch 1,8,32 > $OUT/bench_decode.log 2>&1; grep -E "^\| int2" $OUT/bench_decode.log | cut -d'|' -f2-4,8,13-14
cd $OUT && tar -czf logs.tgz --remove-files *.log 2>/dev/null; echo "done ($(( $(date +%s) - t0 )) s)"
