#!/usr/bin/env bash
# Configures and builds oscar in ./build (Release, tests on). Extra arguments go to cmake.
set -euo pipefail
cd "$(dirname "$0")/.."
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
cmake -S . -B build "${gen[@]}" -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build build -j "$(nproc)"
