#!/usr/bin/env bash
# oscar's batch-1 CPU decode next to llama.cpp's, same machine, same model, same text, in
# interleaved rounds (this VM's speed drifts by tens of percent between minutes, so one run of each
# is not a comparison). Issue #9's target: oscar's bf16 cache at least llama.cpp's tokens/s at
# 512 / 2K / 8K context, BF16 weights, 2 threads.
#
#   bash bench/llamacpp/run.sh [ROUNDS=5] [CONTEXTS=512,2048,8192]
#
# Needs build/bench/bench_model (scripts/build.sh), g++, npm (Debian's npm) and python3. The first
# run installs the npm package of node-llama-cpp's prebuilt llama.cpp CPU libraries (libllama,
# libggml and a libggml-cpu per x86 level) into build/llamacpp/npm, builds llamacpp_decode.cpp
# against them, and converts models/tiny-qwen3 to GGUF (to_gguf.py, BF16). llama.cpp runs twice a
# round: its default flash attention (auto, which picks it on the CPU) and without it.
# Rows go to stdout and to build/llamacpp/rounds.md.
set -euo pipefail
if [[ "${1:-}" == -h || "${1:-}" == --help ]]; then
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit 0
fi
cd "$(dirname "$0")/../.."
rounds=${1:-5}
contexts=${2:-512,2048,8192}
decode=256  # timed decode tokens per row, each engine (docs/results/bench_method.md)
model=models/tiny-qwen3
dir=build/llamacpp
version=3.22.1  # @node-llama-cpp/linux-x64, the binaries of node-llama-cpp 3.22.1

mkdir -p "$dir/npm"
if [ ! -d "$dir/npm/node_modules/@node-llama-cpp/linux-x64" ]; then
  # Only the package of prebuilt Linux x64 CPU binaries: no JavaScript of it runs here.
  echo '{"name":"oscar-llamacpp-peer","private":true}' > "$dir/npm/package.json"
  npm install --prefix "$dir/npm" --ignore-scripts --no-audit --no-fund \
    "@node-llama-cpp/linux-x64@$version" >/dev/null
fi
libs="$dir/npm/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64"
if [ ! -x "$dir/llamacpp_decode" ]; then
  g++ -O2 -std=c++20 bench/llamacpp/llamacpp_decode.cpp -o "$dir/llamacpp_decode" -L"$libs" \
    -l:libllama.v0.5.0.so -l:libggml.v0.5.0.so -Wl,-rpath,"$(realpath "$libs")"
fi
gguf="$dir/tiny-qwen3-bf16.gguf"
[ -f "$gguf" ] || python3 bench/llamacpp/to_gguf.py "$model" "$gguf"

export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
out="$dir/rounds.md"
: > "$out"
for r in $(seq 1 "$rounds"); do
  # One repetition a round (the rounds are the repetitions), after bench_model's warm-up steps;
  # llamacpp_decode has no warm-up.
  ./build/bench/bench_model --model "$model" --modes bf16,oscar --contexts "$contexts" \
    --decode-tokens "$decode" --reps 1 2>/dev/null | grep '^| \(bf16\|oscar\) ' |
    sed "s/^/round $r /" | tee -a "$out"
  for fa in auto off; do
    "$dir/llamacpp_decode" "$gguf" "$model/data/dev_eval.txt" "$libs" "$contexts" "$decode" \
      "$OMP_NUM_THREADS" "$fa" 2>/dev/null | grep '^| llama' | sed "s/^/round $r /" | tee -a "$out"
  done
done
# Medians of decode tokens/s per engine and context (the last column of every row).
python3 - "$out" <<'EOF'
import re, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    cells = [c.strip() for c in line.split("|")[1:-1]]
    name, ctx = cells[0], cells[-3] if cells[0].startswith("llama") else cells[2]
    rows.setdefault((name, int(ctx)), []).append(float(cells[-1]))
print("\n| engine | context | decode tok/s, median of %d rounds |\n|---|---|---|" %
      max(len(v) for v in rows.values()))
for (name, ctx), v in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
    print("| %s | %d | %.1f |" % (name, ctx, statistics.median(v)))
EOF
