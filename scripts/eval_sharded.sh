#!/usr/bin/env bash
# Runs `oscar eval` as many single-threaded shards in parallel and merges them into one report:
# the way to evaluate the full protocol (100 perplexity windows, 100 NIAH prompts per length) on a
# many-core machine in minutes. Each shard's command line is kept in the merged JSON.
#
#   scripts/eval_sharded.sh OUT_PREFIX MODE[,MODE...] [EXTRA_EVAL_ARGS...]
#
# Environment (defaults in brackets):
#   OSCAR            the oscar binary [build/apps/oscar]
#   JOBS             shards at a time [nproc]
#   PPL_WINDOWS      perplexity windows, in shards of PPL_SHARD [100], PPL_SHARD [5]
#   NIAH_LENGTHS     NIAH lengths, space-separated [1024 2048 4096 8192]
#   NIAH_PER_LENGTH  prompts per length, in shards of NIAH_SHARD [100], NIAH_SHARD [5]
#   FIDELITY_WINDOWS fidelity windows (one shard) [4]
# Writes OUT_PREFIX.json/.svg (merged) and OUT_PREFIX.shards/ (each shard's JSON and log).
set -euo pipefail
if [[ $# -lt 2 ]]; then
  sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
out=$1 modes=$2
shift 2
oscar=${OSCAR:-build/apps/oscar}
jobs=${JOBS:-$(nproc)}
ppl_windows=${PPL_WINDOWS:-100} ppl_shard=${PPL_SHARD:-5}
niah_lengths=${NIAH_LENGTHS:-1024 2048 4096 8192}
niah_per=${NIAH_PER_LENGTH:-100} niah_shard=${NIAH_SHARD:-5}
fid_windows=${FIDELITY_WINDOWS:-4}
dir=$out.shards
mkdir -p "$dir"
rm -f "$dir"/*.json "$dir"/*.log

base=("$oscar" eval --modes "$modes" --no-progress "$@")
cmds=$dir/commands.txt
: >"$cmds"
add() {  # name, ppl windows, NIAH prompts per length, fidelity windows, then more arguments
  local name=$1 ppl=$2 niah=$3 fid=$4
  shift 4
  printf '%q ' "${base[@]}" --ppl-windows "$ppl" --niah-per-length "$niah" \
    --fidelity-windows "$fid" "$@" --out "$dir/$name" >>"$cmds"
  printf '> %q 2>&1\n' "$dir/$name.log" >>"$cmds"
}
# Longest shards first, so the pool drains evenly.
for len in $(tr ' ' '\n' <<<"$niah_lengths" | sort -rn); do
  for ((s = 0; s < niah_per; s += niah_shard)); do
    add "niah${len}_$s" 0 "$niah_shard" 0 --niah-lengths "$len" --niah-skip "$s"
  done
done
for ((w = 0; w < ppl_windows; w += ppl_shard)); do
  add "ppl_$w" "$ppl_shard" 0 0 --ppl-first-window "$w"
done
if ((fid_windows > 0)); then add fidelity 0 0 "$fid_windows"; fi

n=$(wc -l <"$cmds")
echo "eval_sharded: $n shards, $jobs at a time, modes $modes" >&2
start=$(date +%s)
OMP_NUM_THREADS=1 xargs -P "$jobs" -I{} -d '\n' bash -c '{}' <"$cmds" || {
  echo "eval_sharded: a shard failed; logs in $dir" >&2
  grep -l -i "error" "$dir"/*.log >&2 || true
  exit 1
}
echo "eval_sharded: shards done in $(($(date +%s) - start)) s" >&2
# Numeric order (ppl_5 before ppl_10), so per-window losses are listed in window order.
mapfile -t parts < <(ls "$dir"/*.json | sort -V)
"$oscar" eval --merge "${parts[@]}" --out "$out"
