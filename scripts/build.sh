#!/usr/bin/env bash
# Configures and builds oscar in ./build (Release, tests and benchmarks on: benchmarks are built,
# not run, so CI keeps them compiling). Extra arguments go to cmake.
set -euo pipefail
cd "$(dirname "$0")/.."
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
cmake -S . -B build "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DOSCAR_BUILD_BENCH=ON "$@"
cmake --build build -j "$(nproc)"
