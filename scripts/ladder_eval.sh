#!/usr/bin/env bash
# Device-machine driver for docs/results/precision_ladder.md (the doc lists what it ran).
#   scripts/ladder_eval.sh build
#   scripts/ladder_eval.sh ppl  NAME MODES WINDOWS PER_SHARD
#   scripts/ladder_eval.sh niah NAME MODES LENGTH PROMPTS PER_SHARD
# One single-threaded `oscar eval` per (mode, slice), all cores busy, merged into $OUT/NAME.json.
# DEVICE=cuda runs the shards on the GPU (JOBS of them at once, default 6); JOBS sets the number
# of concurrent shards (default: every core).
set -euo pipefail
device=${DEVICE:-cpu}
jobs=${JOBS:-$([[ $device == cpu ]] && nproc || echo 6)}
step=$1; shift
o=${BIN:-build/apps/oscar}
case $step in
  build)
    cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DOSCAR_BUILD_TESTS=OFF >/dev/null
    cmake --build build -j "$(nproc)" --target oscar 2>&1 | tail -1
    exit 0 ;;
  ppl)  name=$1 modes=$2 total=$3 per=$4 ;;
  niah) name=$1 modes=$2 len=$3 total=$4 per=$5 ;;
esac
dir=/tmp/shards_$name
mkdir -p "$dir"; rm -f "$dir"/*
cmds=$dir/cmds.txt; : >"$cmds"
IFS=, read -ra ms <<<"$modes"
for m in "${ms[@]}"; do
  tag=${m//[:=.]/_}
  for ((s = 0; s < total; s += per)); do
    if [[ $step == ppl ]]; then
      args="--ppl-windows $per --ppl-first-window $s --ppl-tail-from 2048 --niah-per-length 0 --niah-lengths 1024"
    else
      args="--ppl-windows 0 --niah-lengths $len --niah-per-length $per --niah-skip $s"
    fi
    echo "$o eval --device $device --modes '$m' --no-progress --fidelity-windows 0 $args --out $dir/${tag}_$s > $dir/${tag}_$s.log 2>&1" >>"$cmds"
  done
done
start=$(date +%s)
OMP_NUM_THREADS=1 xargs -P "$jobs" -I{} -d '\n' bash -c '{}' <"$cmds" || { tail -n 3 "$dir"/*.log | tail -40; exit 1; }
echo "$name: $(wc -l <"$cmds") shards in $(($(date +%s) - start)) s"
mapfile -t parts < <(ls "$dir"/*.json | sort -V)
$o eval --merge "${parts[@]}" --out "$OUT/$name" 2>&1 | tail -14
