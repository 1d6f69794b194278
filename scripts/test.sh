#!/usr/bin/env bash
# The README's test command: build, then run every CPU test label (unit and model). Extra
# arguments go to cmake (CI adds -DOSCAR_WERROR=ON).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/need.sh
need ctest cmake
# The OpenAI-client conformance test (tests/e2e, label model) needs these; without node it would
# not even be registered, so check up front rather than pass with one test fewer.
need node nodejs
need npm npm
need curl curl
# The /metrics check (tests/e2e/metrics, label model) parses with the Prometheus project's parser.
/usr/bin/python3 -c 'import prometheus_client.parser' 2>/dev/null ||
  python3 -c 'import prometheus_client.parser' 2>/dev/null || {
  echo "$(basename "$0"): the python3 module prometheus_client not found: install the Debian package python3-prometheus-client (bash scripts/setup.sh installs every dependency)" >&2
  exit 1
}
bash scripts/build.sh "$@"
ctest --test-dir build --output-on-failure -L "unit|model" -j 2
