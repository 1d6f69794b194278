#!/usr/bin/env bash
# One call on the GPU machine: device facts, correctness of every CUDA kernel against the CPU
# reference (test_decode_attn_cuda: fresh random inputs, many shapes), the decode-attention
# benchmark (bench_decode_attn_cuda: copy bandwidth, INT2 and BF16 modes, 8K-128K x batch
# 1/8/32), the peers in the same run (.peers/oscar_release_decode.py: the OSCAR release's Triton
# INT2 kernel and PyTorch SDPA), then a short table of ratios. Logs under $OUT.
#
# Runs from the checkout root on that machine, with the binaries copied into .gpu/ (ignored) and
# .gpu and .peers named in the call's carry:
#   bash .gpu/gpu-check.sh [test|model|run|step|kernels|torch|bench|variants|peers|ncu|sass] ...
#   (default: test model run)
# Prepared here with scripts/gpu-pack.sh (build outputs + this script -> /work/main/.gpu).
set -uo pipefail
OUT=${OUT:-/tmp/oscar-gpu-out}
mkdir -p "$OUT"
G=$(cd "$(dirname "$0")" && pwd)
export LD_LIBRARY_PATH="$G/lib:${LD_LIBRARY_PATH:-}"
what=${*:-test model run}
# cuBLASLt: the toolkit's, else the copy PyTorch ships.
CUBLAS=$(ls /usr/local/cuda/lib64/libcublasLt.so.13 2>/dev/null || find /usr/local /opt -name libcublasLt.so.13 2>/dev/null | head -1)
[ -n "$CUBLAS" ] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(dirname "$CUBLAS")"
echo "cublasLt: ${CUBLAS:-not found}"
t0=$(date +%s)

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,power.limit,temperature.gpu --format=csv
  nvidia-smi -q | grep -iE "persistence|compute mode|MIG mode" | head -5
} > "$OUT/device.txt" 2>&1
cat "$OUT/device.txt"

for w in $what; do
  case $w in
    test)
      # Every CUDA kernel against its CPU op (fresh random inputs, tolerances in each file).
      for t in test_decode_attn_cuda test_ops_cuda test_demote_pages_cuda test_linear_cuda test_prefill_attn_cuda; do
        [ -x "$G/$t" ] || { echo "== $t: missing"; continue; }
        echo "== $t"
        "$G/$t" --gtest_color=no > "$OUT/$t.log" 2>&1
        echo "rc=$? ($(( $(date +%s) - t0 )) s)"
        grep -E "^\[  (PASSED|FAILED) |^\[  FAILED" "$OUT/$t.log" | head -12
        grep -A4 "Failure" "$OUT/$t.log" | head -24
      done
      ;;
    model)
      # The whole model on the GPU: against the CPU backend (logits per step, greedy through the
      # scheduler) and against the goldens of models/tiny-qwen3.
      echo "== test_model_cuda"
      "$G/test_model_cuda" --gtest_color=no > "$OUT/test_model_cuda.log" 2>&1
      echo "rc=$? ($(( $(date +%s) - t0 )) s)"
      grep -E "^\[(bf16|int2|oscar)|^\[  (PASSED|FAILED) |^\[  FAILED|Failure" "$OUT/test_model_cuda.log" | head -40
      if [ -x "$G/test_golden" ]; then
        echo "== test_golden (OSCAR_TEST_DEVICE=cuda)"
        OSCAR_TEST_DEVICE=cuda "$G/test_golden" --gtest_color=no > "$OUT/test_golden_cuda.log" 2>&1
        echo "rc=$? ($(( $(date +%s) - t0 )) s)"
        grep -E "max_abs|^\[  (PASSED|FAILED) |^\[  FAILED|Failure" "$OUT/test_golden_cuda.log" | head -30
      fi
      ;;
    run)
      # oscar run at temperature 0 on each device: the same text (the served path is the same
      # scheduler; test_model_cuda compares it token by token).
      for dev in cpu cuda; do
        "$G/oscar" run --model models/tiny-qwen3 --device $dev --max-tokens 48 --temperature 0 \
          --prompt "The capital of France is" > "$OUT/run_$dev.txt" 2> "$OUT/run_$dev.err"
        echo "== run --device $dev rc=$?: $(head -c 300 "$OUT/run_$dev.txt" | tr '\n' ' ')"
      done
      cmp -s "$OUT/run_cpu.txt" "$OUT/run_cuda.txt" && echo "run: cpu and cuda outputs identical" || echo "run: outputs differ"
      ;;
    eval)
      # The evaluation on each device, same windows and prompts: perplexity (decode-equivalent
      # prefill) and NIAH. The CPU one runs on the host's cores at the same time.
      E="--modes ${EVAL_MODES:-bf16,int2-hadamard,oscar} --ppl-windows ${EVAL_WINDOWS:-8} --niah-lengths 1024,4096 --niah-per-length ${EVAL_NIAH:-20} --fidelity-windows 0"
      "$G/oscar" eval --device cpu $E -o "$OUT/eval_cpu" > "$OUT/eval_cpu.log" 2>&1 &
      epid=$!
      "$G/oscar" eval --device cuda $E -o "$OUT/eval_cuda" > "$OUT/eval_cuda.log" 2>&1
      echo "eval cuda rc=$? ($(( $(date +%s) - t0 )) s)"
      wait $epid
      echo "eval cpu rc=$? ($(( $(date +%s) - t0 )) s)"
      python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
def load(d):
    try: return json.load(open(f"{out}/eval_{d}.json"))
    except Exception as e: return {"error": repr(e)}
c, g = load("cpu"), load("cuda")
def rows(j):
    r = {}
    for m in j.get("modes", []):
        p = m.get("ppl", {})
        n = {x["target_len"]: x["accuracy"] for x in m.get("niah", {}).get("per_length", [])}
        r[m["mode"]] = (p.get("ppl"), n, p.get("seconds"))
    return r
rc, rg = rows(c), rows(g)
if not rc or not rg: print("cpu:", str(c)[:600]); print("cuda:", str(g)[:600])
print("| mode | ppl cpu | ppl cuda | NIAH cpu | NIAH cuda |")
print("|---|---|---|---|---|")
for mode in rc:
    a, b = rc[mode], rg.get(mode, (None, {}, None))
    print(f"| {mode} | {a[0]} | {b[0]} | {a[1]} | {b[1]} |")
print("seconds: cpu", c.get("seconds"), "cuda", g.get("seconds"))
PY
      ;;
    serve)
      # oscar serve --device cuda answers an OpenAI completion at temperature 0 with the text
      # oscar run gives on the CPU.
      "$G/oscar" serve --model models/tiny-qwen3 --device cuda --port 8123 > "$OUT/serve.log" 2>&1 &
      spid=$!
      for i in $(seq 60); do curl -sf localhost:8123/health > /dev/null 2>&1 && break; sleep 0.5; done
      curl -s localhost:8123/v1/completions -H 'Content-Type: application/json' \
        -d '{"model": "tiny-qwen3", "prompt": "The capital of France is", "max_tokens": 48, "temperature": 0}' > "$OUT/serve.json"
      curl -s localhost:8123/metrics | grep -E "^oscar_device_memory|^vllm:kv_cache_usage" | head -4
      kill $spid; wait $spid 2>/dev/null
      "$G/oscar" run --model models/tiny-qwen3 --device cpu --max-tokens 48 --temperature 0 \
        --prompt "The capital of France is" > "$OUT/run_cpu.txt" 2>/dev/null
      python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
served = json.load(open(out + "/serve.json"))["choices"][0]["text"]
ran = open(out + "/run_cpu.txt").read()
print("serve --device cuda:", repr(served[:120]))
print("run --device cpu:   ", repr(ran[:120]))
print("served text equals oscar run on the CPU:", served.strip() == ran.strip())
PY
      ;;
    prefill)
      # Time to first token, the shared-prefix load test and the running streams' inter-token
      # latency during a long prefill, through `oscar serve --device cuda` (Qwen3-8B shape, dummy
      # weights; bench/e2e/serve_prefill.py is the client), per cache mode; then the PyTorch peer
      # (.peers/torch_prefill.py: whole prompt in one pass) in the same call.
      # PREFILL_MODES, PREFILL_CHUNK / PREFILL_MBT (tokens per request per step / per step),
      # PREFILL_TTFT, PREFILL_SHARED, PREFILL_ITL override the defaults below; PREFILL_ITL_FACTOR
      # sets serve --prefill-itl-factor (the step budget beside running streams).
      m=${PREFILL_MODEL:-qwen3-8b}
      for mode in ${PREFILL_MODES:-bf16 int2-hadamard}; do
        port=$(( 18000 + RANDOM % 2000 ))
        "$G/oscar" serve --model "$G/configs/$m" --dummy-weights --device cuda --kv-cache $mode \
          --kv-budget ${PREFILL_KV_MIB:-60000} --max-model-len 131072 --port $port \
          ${PREFILL_CHUNK:+--prefill-chunk $PREFILL_CHUNK} ${PREFILL_MBT:+--max-batch-tokens $PREFILL_MBT} \
          ${PREFILL_ITL_FACTOR:+--prefill-itl-factor $PREFILL_ITL_FACTOR} \
          > "$OUT/prefill_serve_$mode.log" 2>&1 &
        spid=$!
        for i in $(seq 240); do curl -sf localhost:$port/health > /dev/null 2>&1 && break; sleep 0.5; done
        echo "== prefill $m $mode (server up after $(( $(date +%s) - t0 )) s)"
        PYTHONUNBUFFERED=1 timeout ${PREFILL_TIMEOUT:-300} python3 bench/e2e/serve_prefill.py \
          --url http://127.0.0.1:$port --out "$OUT/prefill_${m}_${mode}${PREFILL_CHUNK:+_c$PREFILL_CHUNK}${PREFILL_ITL_FACTOR:+_f$PREFILL_ITL_FACTOR}.json" \
          --tag "$m $mode chunk ${PREFILL_CHUNK:-default}" \
          --ttft "${PREFILL_TTFT-8192,32768,102400}" --shared "${PREFILL_SHARED-32x16384+64/256}" \
          --itl "${PREFILL_ITL-8x102400}" 2>&1 | tee -a "$OUT/prefill.log"
        kill $spid; wait $spid 2>/dev/null
        grep -iE "error|fail" "$OUT/prefill_serve_$mode.log" | head -5
      done
      if [ -n "${PREFILL_TORCH_LENS-8192,32768,102400}" ]; then
        echo "== peers: torch_prefill.py ($(( $(date +%s) - t0 )) s)"
        PYTHONUNBUFFERED=1 timeout ${TORCH_TIMEOUT:-240} python3 .peers/torch_prefill.py --out "$OUT" \
          --lens "${PREFILL_TORCH_LENS-8192,32768,102400}" --models $m 2>&1 | tee -a "$OUT/prefill.log" | tail -8
      fi
      ;;
    step)
      # A whole decode step, Qwen3-8B / 4B shapes with dummy weights, 100K context: the BF16
      # cache against the INT2 history (int2-hadamard: the oscar kernels without a rotation
      # file, which dummy weights cannot have), then the fixed-budget comparison.
      for m in qwen3-8b qwen3-4b; do
        echo "== bench_decode_step $m" | tee -a "$OUT/step.log"
        "$G/bench_decode_step" --model "$G/configs/$m" --dummy-weights --device cuda --modes bf16,int2-hadamard \
          --context 102400 --batches 1,4 --steps ${STEP_STEPS:-48} --csv "$OUT/step_$m.csv" 2>&1 | tee -a "$OUT/step.log"
      done
      echo "== without CUDA graphs (qwen3-8b)" | tee -a "$OUT/step.log"
      "$G/bench_decode_step" --model "$G/configs/qwen3-8b" --dummy-weights --device cuda --modes bf16,int2-hadamard \
        --context 102400 --batches 1,4 --steps 32 --no-graphs 2>&1 | grep -E "^\|" | tee -a "$OUT/step.log"
      echo "== where a step's GPU time goes (qwen3-8b, batch 1; CUDA events around every op)" | tee -a "$OUT/step.log"
      "$G/bench_decode_step" --model "$G/configs/qwen3-8b" --dummy-weights --device cuda --modes bf16,int2-hadamard \
        --context 102400 --batches 1 --steps 16 --phases 2>&1 | grep -E "^\||GPU time" | tee -a "$OUT/step.log"
      echo "== fixed budget: qwen3-8b, ${FIT_GIB:-100} GiB of KV pages" | tee -a "$OUT/step.log"
      "$G/bench_decode_step" --model "$G/configs/qwen3-8b" --dummy-weights --device cuda --modes bf16,int2-hadamard \
        --context 102400 --fit-gib ${FIT_GIB:-100} --steps 16 --csv "$OUT/step_fit.csv" 2>&1 | tee -a "$OUT/step.log"
      echo "($(( $(date +%s) - t0 )) s)"
      ;;
    kernels)
      for b in bench_linear_cuda bench_demote_cuda bench_prefill_attn_cuda; do
        [ -x "$G/$b" ] || continue
        echo "== $b" | tee -a "$OUT/kernels.log"
        "$G/$b" 2>&1 | tee -a "$OUT/kernels.log"
      done
      ;;
    torch)
      echo "== peers: torch_decode_step.py"
      PYTHONUNBUFFERED=1 timeout ${TORCH_TIMEOUT:-300} python3 .peers/torch_decode_step.py --out "$OUT" > "$OUT/torch_step.log" 2>&1
      echo "rc=$? ($(( $(date +%s) - t0 )) s)"
      tail -12 "$OUT/torch_step.log"
      ;;
    bench)
      echo "== bench_decode_attn_cuda"
      "$G/bench_decode_attn_cuda" --csv "$OUT/bench.csv" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log"
      echo "($(( $(date +%s) - t0 )) s)"
      ;;
    variants)
      # INT2 in the wide configuration, other split counts at 128K, the generic (dequantize-to-
      # BF16) history path, loads alone (compute skipped), BF16 in the dense configuration.
      echo "== bench variants" | tee -a "$OUT/bench.log"
      B="$G/bench_decode_attn_cuda --iters 20"
      V() { $B "$@" 2>&1 | grep -E "^\| (int2|bf16)|order" | tee -a "$OUT/bench.log"; }
      V --modes int2 --ctx 32768,131072 --batch 1,8,32 --config 1
      V --modes int2 --ctx 131072 --batch 1,8 --splits 98
      V --modes int2 --ctx 32768,131072 --batch 8 --path generic
      V --modes int2 --ctx 131072 --batch 1,8,32 --debug 1
      V --modes bf16 --ctx 131072 --batch 8,32 --config 2
      echo "($(( $(date +%s) - t0 )) s)"
      ;;
    sass)
      # The decode-attention kernels' machine code (the kernels live in the shared library).
      cuobjdump -sass "$G/lib/liboscar_kernels_cuda.so" 2>&1 |
        awk '/Function :/ {keep = /decode_attn_kernel/} keep' > "$OUT/sass.txt"
      echo "sass: $(wc -l < "$OUT/sass.txt") lines, HMMA $(grep -c HMMA "$OUT/sass.txt"), LOP3 $(grep -c LOP3 "$OUT/sass.txt")"
      gzip -f "$OUT/sass.txt"
      ;;
    peers)
      echo "== peers"
      PYTHONUNBUFFERED=1 timeout ${PEERS_TIMEOUT:-420} python3 .peers/oscar_release_decode.py \
        --out "$OUT/peers" ${PEERS_ARGS:-} > "$OUT/peers.log" 2>&1
      echo "rc=$? ($(( $(date +%s) - t0 )) s)"
      tail -5 "$OUT/peers.log"
      ;;
    ncu)
      M=smsp__inst_executed.sum,dram__bytes_read.sum,lts__t_sectors_srcunit_tex_op_read.sum,smsp__cycles_active.avg
      for r in long_scoreboard short_scoreboard wait barrier math_pipe_throttle mio_throttle lg_throttle not_selected selected dispatch_stall no_instruction branch_resolving imc_miss misc tex_throttle; do
        M=$M,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio
      done
      # Pipe utilization (ComputeWorkloadAnalysis: the tensor pipe of mma.sync vs the ALU/FMA
      # pipes) and, per shape in NCU_SHAPES (ctx:batch), both kernels of a call with durations.
      M=$M,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_tensor_op_hmma.sum,sm__inst_executed_pipe_alu.sum,sm__inst_executed_pipe_fma.sum,sm__inst_executed_pipe_lsu.sum,sm__inst_executed_pipe_xu.sum
      for mode in ${NCU_MODES:-int2 bf16}; do
        for shape in ${NCU_SHAPES:-131072:8}; do
          ctx=${shape%%:*}; bat=${shape##*:}
          echo "== ncu ($ctx x $bat, $mode)" | tee -a "$OUT/ncu.txt"
          ncu --clock-control none --kernel-name regex:"decode_attn_kernel|combine_kernel" --launch-skip 10 --launch-count 2 \
            --section SpeedOfLight --section Occupancy --section SchedulerStats --section WarpStateStats \
            --section ComputeWorkloadAnalysis --metrics "$M" "$G/bench_decode_attn_cuda" --ctx $ctx --batch $bat \
            --iters 3 --modes $mode >> "$OUT/ncu.txt" 2>&1
        done
      done
      grep -E "== ncu|decode_attn_kernel|combine_kernel|Duration|DRAM Throughput|Compute \(SM\)|Registers|Achieved Occupancy|Issued Warp|No Eligible|inst_executed|dram__bytes|issue_stalled|pipe_tensor|Pipe" "$OUT/ncu.txt" | awk '$NF+0 > 0.05 || /==|kernel|Duration|DRAM|inst|Issued|Eligible|Occupancy|Registers|pipe/' | cut -c1-150 | head -150
      ;;
    ncu-prefill)
      # The prefill kernel under Nsight Compute, one launch per (case, path) of
      # bench_prefill_attn_cuda (NCU_PREFILL: "case:path ...", cases in its table's order).
      M=smsp__inst_executed.sum,smsp__cycles_active.avg,sm__inst_executed_pipe_alu.sum,sm__inst_executed_pipe_fma.sum,sm__inst_executed_pipe_lsu.sum,sm__inst_executed_pipe_xu.sum
      for r in long_scoreboard short_scoreboard wait barrier math_pipe_throttle mio_throttle lg_throttle not_selected selected dispatch_stall no_instruction branch_resolving misc; do
        M=$M,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio
      done
      for cp in ${NCU_PREFILL:-2:auto 3:auto}; do
        echo "== ncu prefill case ${cp%%:*} path ${cp##*:}" | tee -a "$OUT/ncu_prefill.txt"
        ncu --clock-control none --kernel-name regex:"prefill_attn" --launch-skip 2 --launch-count 1 \
          --section SpeedOfLight --section Occupancy --section SchedulerStats --section WarpStateStats \
          --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section LaunchStats \
          --section SourceCounters --metrics "$M" "$G/bench_prefill_attn_cuda" --case ${cp%%:*} \
          --path ${cp##*:} --iters 1 >> "$OUT/ncu_prefill.txt" 2>&1
        echo "rc=$? ($(( $(date +%s) - t0 )) s)"
      done
      grep -E "== ncu|Duration|Throughput|Registers|Achieved Occupancy|Issued Warp|No Eligible|Eligible Warps|issue_stalled|Pipe|inst_executed|L1/TEX Hit|L2 Hit|Shared Memory|Bank" "$OUT/ncu_prefill.txt" | cut -c1-150 | head -120
      ;;
  esac
done

# Short table: our kernel vs the release kernel and SDPA, from this run's files.
[ -f "$OUT/bench.csv" ] && python3 - "$OUT" <<'PY' | tee "$OUT/summary.txt"
import csv, json, os, sys
out = sys.argv[1]
ours = {}
p = os.path.join(out, "bench.csv")
if os.path.exists(p):
    for r in csv.DictReader(open(p)):
        ours[(r["mode"], int(r["ctx"]), int(r["batch"]))] = r
peer = {}
pj = os.path.join(out, "peers", "oscar_release_decode.json")
copy_peer = None
if os.path.exists(pj):
    j = json.load(open(pj))
    copy_peer = j.get("copy_tbs")
    for c in j.get("cells", []):
        peer[(int(c["L"]), int(c["B"]))] = c
copy_ours = next((float(r["copy_tbs"]) for r in ours.values()), float("nan"))
print(f"copy bandwidth: ours {copy_ours:.2f} TB/s, peers' {copy_peer if copy_peer is None else round(copy_peer, 2)} TB/s")
print("| ctx | batch | int2 us | TB/s | bf16 us | TB/s | release int2 us | SDPA us | int2 vs SDPA | int2 vs release | bf16 vs SDPA |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
keys = sorted({(k[1], k[2]) for k in ours})
for L, B in keys:
    i = ours.get(("int2", L, B)); b = ours.get(("bf16", L, B)); c = peer.get((L, B), {})
    f = lambda r, k: float(r[k]) if r else float("nan")
    iu, bu = f(i, "median_us"), f(b, "median_us")
    ru = 1e3 * c["int2_ms"] if c.get("int2_ms") else float("nan")
    su = 1e3 * c["sdpa_ms"] if c.get("sdpa_ms") else float("nan")
    print(f"| {L//1024}K | {B} | {iu:.1f} | {f(i,'tbs'):.2f} | {bu:.1f} | {f(b,'tbs'):.2f} | {ru:.1f} | {su:.1f} | "
          f"{su/iu:.2f}x | {ru/iu:.2f}x | {su/bu:.2f}x |")
PY
# The logs travel as one file (a call brings back a limited number of files).
(cd "$OUT" && ls *.log *.txt *.csv >/dev/null 2>&1 && tar -czf logs.tgz --remove-files $(ls *.log *.err 2>/dev/null) 2>/dev/null)
echo "total $(( $(date +%s) - t0 )) s"
