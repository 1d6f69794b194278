#!/usr/bin/env bash
# Configures and builds oscar in ./build (Release, tests and benchmarks on: benchmarks are built,
# not run, so CI keeps them compiling). Extra arguments go to cmake.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/need.sh
need cmake cmake
need c++ build-essential
need pkg-config pkg-config
gen=()
if command -v ninja >/dev/null; then gen=(-G Ninja); else need make build-essential; fi
cmake -S . -B build "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DOSCAR_BUILD_BENCH=ON "$@"
cmake --build build -j "$(nproc)"
