#!/usr/bin/env bash
# Load test at equal KV memory: the same concurrent streaming chat requests (shared system prompt)
# against `oscar serve` with the OSCAR cache and with a BF16 cache under the same --kv-budget.
# Not part of CI (minutes on 2 cores).
#   [DEFAULT_MAX_TOKENS=N] [OUT_TAG=TAG] bash bench/e2e/run_load_test.sh \
#       [BUDGET_MIB=128] [REQUESTS=64] [MAX_TOKENS=32]
# MAX_TOKENS=0 leaves max_tokens out of every request, as OpenAI clients do by default: the
# server's --default-max-tokens then applies, which is the whole remaining context unless
# DEFAULT_MAX_TOKENS=N passes `--default-max-tokens N` (the tiny model rarely stops on its own,
# so without a cap such a run takes well over 15 minutes on 2 cores).
# Writes docs/results/load_test_TAG.{md,json} (TAG: OUT_TAG, default b<BUDGET>_n<REQUESTS>_mt
# <MAX_TOKENS>, plus _cap<N> with DEFAULT_MAX_TOKENS): a table for docs/results/load_test.md,
# whose dated sections are written by hand and never overwritten. Server logs: /tmp/oscar_load_*.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/lib/need.sh
need curl curl
need node nodejs
budget="${1:-128}"; requests="${2:-64}"; max_tokens="${3:-32}"
default_max_tokens="${DEFAULT_MAX_TOKENS:-}"
cap_args=()
[ -n "$default_max_tokens" ] && cap_args=(--default-max-tokens "$default_max_tokens")
tag="${OUT_TAG:-b${budget}_n${requests}_mt${max_tokens}${default_max_tokens:+_cap$default_max_tokens}}"
cmd="bash bench/e2e/run_load_test.sh $budget $requests $max_tokens"
[ -n "$default_max_tokens" ] && cmd="DEFAULT_MAX_TOKENS=$default_max_tokens $cmd"
oscar_mode=oscar
[ -f models/tiny-qwen3/oscar_rotations.safetensors ] || oscar_mode=int2-hadamard
out=docs/results
mkdir -p "$out"
port=$(( 21000 + RANDOM % 20000 ))
results=()
for mode in "$oscar_mode" bf16; do
  ./build/apps/oscar serve --model models/tiny-qwen3 --kv-cache "$mode" --kv-budget "$budget" \
      --kv-split-tokens 1100 --max-running 64 "${cap_args[@]}" --port "$port" > "/tmp/oscar_load_$mode.log" 2>&1 &
  pid=$!
  echo "run_load_test.sh: $mode: $requests requests ($(date -u +%H:%M:%S))" >&2
  until curl -sf "http://127.0.0.1:$port/health" > /dev/null; do sleep 0.2; done
  node bench/e2e/load_test.mjs --url "http://127.0.0.1:$port" --requests "$requests" \
      --concurrency "$requests" --max-tokens "$max_tokens" --system-chars 4000 \
      > "/tmp/oscar_load_$mode.json" || echo "load test: failures in mode $mode" >&2
  kill -TERM "$pid"; wait "$pid" || true
  results+=("$mode")
done
node -e '
const fs = require("fs");
const [oscarMode, budget, cmd, tag, cap] = process.argv.slice(1);
const a = JSON.parse(fs.readFileSync(`/tmp/oscar_load_${oscarMode}.json`));
const b = JSON.parse(fs.readFileSync(`/tmp/oscar_load_bf16.json`));
const pools = (o) => Object.entries(o).map(([k, v]) => `${k.replace(/.*pool="(.*)".*/, "$1")} ${v}`).join(", ");
const total = (r) => Object.fromEntries(Object.entries(r.pools_after).filter(([k]) => k.includes("total")).map(([k, v]) => [k.replace("_total", "_used"), v]));
const peak = (r) => Object.entries(r.pages_used_peak).map(([k, v]) => `${k.replace(/.*pool="(.*)".*/, "$1")} ${v}/${total(r)[k] ?? "?"}`).join(", ");
const row = (m, r) => `| ${m} | ${r.ok}/${r.requests} | ${r.max_running} / ${r.mean_running?.toFixed(1)} | ${r.max_waiting} | ${peak(r)} | ${r.preemptions} | ${r.requests_per_s.toFixed(3)} | ${r.output_tokens_per_s.toFixed(1)} | ${r.ttft_p50_s.toFixed(2)} / ${r.ttft_p99_s.toFixed(2)} | ${(1000*r.tpot_p50_s).toFixed(0)} / ${(1000*r.tpot_p99_s).toFixed(0)} | ${(100*r.prefix_cache_hit_rate).toFixed(1)}% | ${r.wall_s.toFixed(0)} |`;
const md = [
  "# Load test: OSCAR vs BF16 KV cache at equal memory", "",
  `Command: \`${cmd}\` (server: \`oscar serve --kv-budget ${budget} --kv-split-tokens 1100 --max-running 64${cap ? ` --default-max-tokens ${cap}` : ""}\`)`,
  `Date: ${new Date().toISOString()}; machine: 2-core Debian 12 VM, CPU only, tiny-qwen3.`, "",
  `${a.requests} concurrent streaming chat requests sharing a ~1K-token system prompt (${(a.prompt_tokens / a.ok).toFixed(0)} prompt tokens each), ${(a.output_tokens / a.ok).toFixed(0)} output tokens each on average, --kv-budget ${budget} MiB.`, "",
  "| cache | ok | running max / mean | max waiting | peak pages used/total | preemptions | req/s | out tok/s | TTFT p50/p99 s | TPOT p50/p99 ms | prefix hit | wall s |",
  "|---|---|---|---|---|---|---|---|---|---|---|---|", row(oscarMode, a), row("bf16", b), "",
  `Ratios ${oscarMode}/bf16: concurrent sequences ${(a.max_running / b.max_running).toFixed(2)}x, requests/s ${(a.requests_per_s / b.requests_per_s).toFixed(2)}x, output tokens/s ${(a.output_tokens_per_s / b.output_tokens_per_s).toFixed(2)}x.`, "",
  "- \"running\" (most and mean), \"max waiting\" and \"peak pages used\" are read from /metrics every 100 ms (--max-running 64 is not the limit below 64); \"preemptions\" is the growth of oscar_preemptions_total over the run (running requests preempted because a pool ran dry even after evicting the prefix cache, resumed by recompute). Pages used include the prefix cache\x27s unlocked pages, which are evicted before anyone is preempted: a pool at its total is full, not necessarily short.",
  `- Pools after the run: ${oscarMode}: ${pools(Object.fromEntries(Object.entries(a.pools_after).filter(([k]) => k.includes("used"))))}; bf16: ${pools(Object.fromEntries(Object.entries(b.pools_after).filter(([k]) => k.includes("used"))))}: what the prefix cache kept (the shared system prompt, and each request\x27s prompt + output, inserted as it ended), unlocked and evictable; requests left running/waiting: ${a.requests_running_after}/${a.requests_waiting_after} and ${b.requests_running_after}/${b.requests_waiting_after}.`,
  "- CPU only, 2 cores: absolute latencies are those of a 10 M-parameter model on a small VM; the ratios are the point.", ""];
fs.writeFileSync(`docs/results/load_test_${tag}.md`, md.join("\n"));
fs.writeFileSync(`docs/results/load_test_${tag}.json`, JSON.stringify({ command: cmd, [oscarMode]: a, bf16: b }, null, 2));
console.log(md.join("\n"));
' "$oscar_mode" "$budget" "$cmd" "$tag" "$default_max_tokens"
