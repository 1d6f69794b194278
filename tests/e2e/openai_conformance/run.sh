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

# One line naming the Debian package for each tool this needs (scripts/setup.sh installs them all).
for tool in node:nodejs npm:npm curl:curl; do
  command -v "${tool%%:*}" >/dev/null || {
    echo "run.sh: '${tool%%:*}' not found: install the Debian package ${tool#*:} (bash scripts/setup.sh installs every dependency)" >&2
    exit 1
  }
done
if [ ! -f "$here/node_modules/.package-lock.json" ]; then
  # Quiet when it works; on failure npm's own error and what to check, rather than a silent exit.
  npm_log="$(mktemp -t oscar_e2e_npm.XXXXXX.log)"
  if ! (cd "$here" && npm install --no-audit --no-fund --loglevel=error) >"$npm_log" 2>&1; then
    echo "run.sh: 'npm install' in $here failed; npm said:" >&2
    tail -n 30 "$npm_log" >&2
    if grep -qiE 'CERT|certificate' "$npm_log"; then
      echo "run.sh: npm does not trust the registry's TLS certificate: behind a TLS-intercepting proxy, add" \
           "its CA to /usr/local/share/ca-certificates/, run update-ca-certificates, and set" \
           "NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt (or npm config set cafile to that file)" >&2
    fi
    echo "run.sh: this test needs the npm packages of $here/package.json from the registry $(npm config get registry 2>/dev/null):" \
         "is this machine offline, behind a proxy (npm config set proxy/https-proxy, or HTTPS_PROXY)," \
         "or pointed at a registry that is down or lacks it (npm config get registry)?" \
         "Installing them once by hand (cd $here && npm install) also does." >&2
    rm -f "$npm_log"
    exit 1
  fi
  rm -f "$npm_log"
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
