#!/usr/bin/env bash
# The README's test command: build, then run every CPU test label (unit and model). Extra
# arguments go to cmake (CI adds -DOSCAR_WERROR=ON).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh "$@"
ctest --test-dir build --output-on-failure -L "unit|model" -j 2
