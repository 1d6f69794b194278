#!/usr/bin/env bash
# Runs the OpenAI conformance tests against a server binary:
#   tests/e2e/openai_conformance/run.sh SERVER_BINARY [SERVER_ARGS...]
# e.g. run.sh build/tests/server/oscar_fake_server
#      run.sh build/apps/oscar serve --model models/tiny-qwen3
# The server is started as `SERVER_BINARY SERVER_ARGS... --host 127.0.0.1 --port PORT --api-key KEY`
# on a free loopback port, waited for on /health (up to OSCAR_E2E_READY_TIMEOUT seconds, default
# 120), tested with `node --test`, then stopped with SIGTERM. Installs the npm packages when
# node_modules is missing. Exits with the tests' status.
set -euo pipefail
# OSCAR_E2E_DIR: another test directory (its package.json and test/) run the same way.
here="${OSCAR_E2E_DIR:-$(cd "$(dirname "$0")" && pwd)}"
if [ $# -lt 1 ]; then
  echo "usage: $0 SERVER_BINARY [SERVER_ARGS...]" >&2
  exit 2
fi
server="$1"
shift

command -v node >/dev/null || { echo "run.sh: node is not installed" >&2; exit 1; }
if [ ! -f "$here/node_modules/.package-lock.json" ]; then
  (cd "$here" && npm install --no-audit --no-fund --silent)
fi

port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null \
        || echo $(( 20000 + RANDOM % 20000 )))"
key="conformance-$RANDOM$RANDOM"
log="$(mktemp -t oscar_e2e_server.XXXXXX.log)"

"$server" "$@" --host 127.0.0.1 --port "$port" --api-key "$key" >"$log" 2>&1 &
pid=$!
cleanup() {
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  wait "$pid" 2>/dev/null || true
}
trap cleanup EXIT

url="http://127.0.0.1:$port"
deadline=$(( $(date +%s) + ${OSCAR_E2E_READY_TIMEOUT:-120} ))
until [ "$(curl -s -o /dev/null -w '%{http_code}' "$url/health" || true)" = "200" ]; do
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "run.sh: server exited before becoming ready; its log:" >&2
    cat "$log" >&2
    exit 1
  fi
  if [ "$(date +%s)" -ge "$deadline" ]; then
    echo "run.sh: server not ready after ${OSCAR_E2E_READY_TIMEOUT:-120} s; its log:" >&2
    cat "$log" >&2
    exit 1
  fi
  sleep 0.2
done

status=0
(cd "$here" && OSCAR_SERVER_URL="$url" OSCAR_API_KEY="$key" node --test --test-concurrency=1 test/) || status=$?
if [ $status -ne 0 ]; then
  echo "run.sh: tests failed; server log:" >&2
  tail -50 "$log" >&2
fi
rm -f "$log"
exit $status
