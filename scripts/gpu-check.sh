#!/usr/bin/env bash
# One call on the GPU machine: device facts, correctness of every CUDA kernel against the CPU
# reference (test_decode_attn_cuda: fresh random inputs, many shapes), the decode-attention
# benchmark (bench_decode_attn_cuda: copy bandwidth, INT2 and BF16 modes, 8K-128K x batch
# 1/8/32), the peers in the same run (.peers/oscar_release_decode.py: the OSCAR release's Triton
# INT2 kernel and PyTorch SDPA), then a short table of ratios. Logs under $OUT.
#
# Runs from the checkout root on that machine, with the binaries copied into .gpu/ (ignored) and
# .gpu and .peers named in the call's carry:
#   bash .gpu/gpu-check.sh [test|bench|variants|peers|ncu|sass] ...   (default: test bench peers)
# Prepared here with scripts/gpu-pack.sh (build outputs + this script -> /work/main/.gpu).
set -uo pipefail
OUT=${OUT:-/tmp/oscar-gpu-out}
mkdir -p "$OUT"
G=$(cd "$(dirname "$0")" && pwd)
export LD_LIBRARY_PATH="$G/lib:${LD_LIBRARY_PATH:-}"
what=${*:-test bench peers}
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
      echo "== test_decode_attn_cuda"
      "$G/test_decode_attn_cuda" --gtest_color=no > "$OUT/test.log" 2>&1
      echo "rc=$? ($(( $(date +%s) - t0 )) s)"
      grep -E "^\[  (PASSED|FAILED) |^\[       OK|^\[  FAILED|mismatch|non-finite|Failure" "$OUT/test.log" | head -40
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
      cuobjdump -sass "$G/bench_decode_attn_cuda" > "$OUT/sass.txt" 2>&1
      echo "sass: $(wc -l < "$OUT/sass.txt") lines, HMMA $(grep -c HMMA "$OUT/sass.txt"), LOP3 $(grep -c LOP3 "$OUT/sass.txt")"
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
      for mode in ${NCU_MODES:-int2 bf16}; do
        echo "== ncu (128K x 8, $mode)" | tee -a "$OUT/ncu.txt"
        ncu --clock-control none --kernel-name regex:decode_attn_kernel --launch-skip 5 --launch-count 1 \
          --section SpeedOfLight --section Occupancy --section SchedulerStats --section WarpStateStats \
          --metrics "$M" "$G/bench_decode_attn_cuda" --ctx 131072 --batch 8 --iters 3 --modes $mode >> "$OUT/ncu.txt" 2>&1
      done
      grep -E "== ncu|Duration|DRAM Throughput|Compute \(SM\)|Registers|Achieved Occupancy|Issued Warp|No Eligible|inst_executed.sum|dram__bytes|issue_stalled" "$OUT/ncu.txt" | awk '$NF+0 > 0.05 || /==|Duration|DRAM|inst|Issued|Eligible|Occupancy|Registers/' | head -70
      ;;
  esac
done

# Short table: our kernel vs the release kernel and SDPA, from this run's files.
python3 - "$OUT" <<'PY' | tee "$OUT/summary.txt"
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
echo "total $(( $(date +%s) - t0 )) s"
