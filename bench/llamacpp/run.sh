#!/usr/bin/env bash
# oscar's batch-1 CPU decode next to llama.cpp's, built from source on this machine (build.sh),
# same model, in interleaved rounds: oscar, llama.cpp, oscar, llama.cpp, ... (a shared VM's speed
# drifts between minutes, so one run of each is not a comparison; each round is one repetition).
# Issue #28's target: oscar's bf16 cache at least llama.cpp's f16-cache decode tokens/s at
# 512 / 2K / 8K context, the oscar cache at least that from 2K; BF16 weights, 2 threads.
#
#   bash bench/llamacpp/run.sh [ROUNDS=5] [CONTEXTS=512,2048,8192]
#
# Needs build/bench/bench_model (scripts/build.sh) and python3. Builds llama.cpp b10573 out of
# tree (build.sh; LLAMACPP_DIR, default /tmp/llamacpp-b10573) and converts models/tiny-qwen3 to
# a BF16 GGUF there (to_gguf.py). A round: bench_model --modes bf16,oscar (16 warm-up steps, 256
# timed decode tokens after a prefill of CONTEXT tokens), then llama-bench -n 256 -d CONTEXT
# (decode of 256 tokens at that depth, after its own warm-up) for each cache type in CACHES
# (default "f16 q4_0"; f16 is llama.cpp's default), flash attention at its default (auto: on for
# the CPU), each twice: with libgomp's default wait policy (threads spin ~10 ms: llama.cpp's own
# setting, which starves when other processes share the cores) and with oscar's
# (OMP_WAIT_POLICY=PASSIVE GOMP_SPINCOUNT=300, core/omp_env.h), labelled "passive"; POLICIES
# (default "default passive") picks them.
# BENCH_MODEL lists the bench_model binaries to run each round (default ./build/bench/bench_model;
# several: a before/after pair, rows labelled by the binary's file name).
# MODEL and GGUF override the model (e.g. a --dummy-weights shape: set BENCH_MODEL_ARGS too);
# KV_BUDGET_MIB sizes bench_model's KV pools (default 512; a real shape at 16K needs ~2048).
# bench_model's errors (a context that does not fit) go to $LLAMACPP_DIR/bench_model.err.
# Rows go to stdout and to $LLAMACPP_DIR/rounds.md, the medians to the end.
set -euo pipefail
if [[ "${1:-}" == -h || "${1:-}" == --help ]]; then
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit 0
fi
cd "$(dirname "$0")/../.."
rounds=${1:-5}
contexts=${2:-512,2048,8192}
decode=256  # timed decode tokens per row, each engine (docs/results/bench_method.md)
threads=${OMP_NUM_THREADS:-2}
dir=${LLAMACPP_DIR:-/tmp/llamacpp-b10573}
model=${MODEL:-models/tiny-qwen3}
gguf=${GGUF:-$dir/$(basename "$model")-bf16.gguf}
read -r -a model_args <<< "${BENCH_MODEL_ARGS:-}"

LLAMACPP_DIR=$dir bash bench/llamacpp/build.sh >/dev/null
[ -f "$gguf" ] || python3 bench/llamacpp/to_gguf.py "$model" "$gguf"

export OMP_NUM_THREADS=$threads
out="$dir/rounds.md"
: > "$out"
for r in $(seq 1 "$rounds"); do
  echo "round $r: $(uptime)" >&2
  for bin in ${BENCH_MODEL:-./build/bench/bench_model}; do
    label=""
    [ -n "${BENCH_MODEL:-}" ] && label="$(basename "$bin") "
    "$bin" --model "$model" "${model_args[@]}" --modes bf16,oscar --contexts "$contexts" \
      --decode-tokens "$decode" --reps 1 --kv-budget-mib "${KV_BUDGET_MIB:-512}" \
      2>"$dir/bench_model.err" | grep '^| \(bf16\|oscar\) ' |
      sed "s/^| \([a-z0-9]*\) /round $r | \1 $label/" | tee -a "$out"
  done
  for cache in ${CACHES:-f16 q4_0}; do
    for policy in ${POLICIES:-default passive}; do
      env_args=()
      [ "$policy" = passive ] && env_args=(OMP_WAIT_POLICY=PASSIVE GOMP_SPINCOUNT=300)
      env "${env_args[@]}" "$dir/build/bin/llama-bench" -m "$gguf" -t "$threads" -p 0 \
        -n "$decode" -d "$contexts" -ctk "$cache" -ctv "$cache" -r 1 -o jsonl 2>/dev/null |
        python3 -c '
import json, sys
for line in sys.stdin:
    t = json.loads(line)
    print("| llama.cpp b%s %s cache %s | %d | %.1f |" % (
        t["build_number"], t["type_k"], sys.argv[1], t["n_depth"], t["avg_ts"]))
' "$policy" | sed "s/^/round $r /" | tee -a "$out"
    done
  done
done
# Medians of decode tokens/s per engine and context (the last column of every row; the context is
# bench_model's third column, llama.cpp's second last).
python3 - "$out" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    if not line.startswith("round"):
        continue
    cells = [c.strip() for c in line.split("|")[1:-1]]
    name, ctx = cells[0], cells[-2] if cells[0].startswith("llama") else cells[2]
    rows.setdefault((name, int(ctx)), []).append(float(cells[-1]))
print("\n| engine | context | decode tok/s, median | min-max | rounds |\n|---|---|---|---|---|")
for (name, ctx), v in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
    print("| %s | %d | %.1f | %.1f-%.1f | %d |" %
          (name, ctx, statistics.median(v), min(v), max(v), len(v)))
PY
