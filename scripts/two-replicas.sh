#!/usr/bin/env bash
# Two `oscar serve` replicas on loopback (CPU, the embedded tiny-qwen3 model; ranks 0 and 1, their
# own HTTP ports and KV-events endpoints) behind Debian's nginx with consistent hashing on
# X-Session-Id (the configuration of docs/deploy.md, with paths under a temporary directory).
# Sends a few multi-turn /v1/generate conversations under several session ids and checks that
# every request of a session lands on the same replica, both from nginx's X-Oscar-Upstream
# header and from the replicas' own /metrics (generated tokens per replica). Reports each turn's
# cached prompt tokens (the prefix cache at work). Needs nginx and a built `oscar`; .ci/run runs it.
#
# Usage: scripts/two-replicas.sh [path/to/oscar]   (default build/apps/oscar)
# Ports: HTTP 18000/18001, nginx 18080, KV events 15557/15558 (tcp://*:15557 offset by rank).
set -euo pipefail
cd "$(dirname "$0")/.."

OSCAR=${1:-build/apps/oscar}
NGINX=$(command -v nginx || true)
[ -z "$NGINX" ] && [ -x /usr/sbin/nginx ] && NGINX=/usr/sbin/nginx
if [ -z "$NGINX" ]; then
  echo "two-replicas: nginx is not installed. On Debian: sudo apt-get install nginx-light" >&2
  echo "  (or: sudo apt-get install nginx). It is needed only for this script." >&2
  exit 2
fi
if [ ! -x "$OSCAR" ]; then
  echo "two-replicas: no oscar binary at $OSCAR (build it: cmake --build build --target oscar)" >&2
  exit 2
fi
for tool in curl python3; do
  command -v "$tool" >/dev/null || { echo "two-replicas: $tool is needed" >&2; exit 2; }
done

MODEL=models/tiny-qwen3
PORTS=(18000 18001)
LB=18080
TMP=$(mktemp -d /tmp/oscar-two-replicas.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$TMP"
}
trap cleanup EXIT

echo "== $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $("$NGINX" -v 2>&1), $(uname -srm)"
for i in 0 1; do
  OMP_NUM_THREADS=1 "$OSCAR" serve --model "$MODEL" --device cpu --port "${PORTS[$i]}" \
      --kv-budget 64 --kv-cache int2-hadamard --kv-events-endpoint 'tcp://*:15557' --data-parallel-rank "$i" \
      --kv-events-topic "kv@127.0.0.1:${PORTS[$i]}@tiny-qwen3" >"$TMP/replica$i.log" 2>&1 &
  PIDS+=($!)
done

mkdir -p "$TMP/nginx/logs"
cat >"$TMP/nginx/nginx.conf" <<EOF
worker_processes 1;
pid $TMP/nginx/nginx.pid;
error_log $TMP/nginx/logs/error.log warn;
events { worker_connections 256; }
http {
    access_log $TMP/nginx/logs/access.log;
    client_body_temp_path $TMP/nginx/body;
    proxy_temp_path $TMP/nginx/proxy;
    fastcgi_temp_path $TMP/nginx/fastcgi;
    uwsgi_temp_path $TMP/nginx/uwsgi;
    scgi_temp_path $TMP/nginx/scgi;
    map \$http_x_session_id \$oscar_session {
        ""      \$request_id;
        default \$http_x_session_id;
    }
    upstream oscar {
        hash \$oscar_session consistent;
        server 127.0.0.1:${PORTS[0]} max_fails=3 fail_timeout=10s;
        server 127.0.0.1:${PORTS[1]} max_fails=3 fail_timeout=10s;
        keepalive 8;
    }
    server {
        listen 127.0.0.1:$LB;
        client_max_body_size 8m;
        location /v1/ {
            proxy_pass http://oscar;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 600s;
            add_header X-Oscar-Upstream \$upstream_addr always;
        }
    }
}
EOF
"$NGINX" -t -p "$TMP/nginx" -c "$TMP/nginx/nginx.conf" 2>&1 | sed 's/^/nginx: /'
"$NGINX" -p "$TMP/nginx" -c "$TMP/nginx/nginx.conf" -g 'daemon off;' 2>>"$TMP/nginx/logs/stderr" &
PIDS+=($!)

for port in "${PORTS[@]}" "$LB"; do
  path=/health
  [ "$port" = "$LB" ] && path=/v1/models
  for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$port$path" >/dev/null 2>&1 && break
    sleep 0.1
  done
  curl -sf "http://127.0.0.1:$port$path" >/dev/null || {
    echo "two-replicas: port $port did not come up" >&2
    cat "$TMP"/replica*.log "$TMP/nginx/logs/"* >&2 || true
    exit 1
  }
done
grep -h "kv events: publishing" "$TMP"/replica*.log | sed 's/^.*kv events: /replica: /' || true

gen_tokens() {  # oscar_generation_tokens_total of a replica
  curl -s "http://127.0.0.1:$1/metrics" | awk '$1 == "oscar_generation_tokens_total" {print $2}'
}
before=()
for port in "${PORTS[@]}"; do before+=("$(gen_tokens "$port")"); done

# Several sessions, three turns each: turn k's prompt is turn k-1's prompt, its output and a
# new user message (ids), so a replica that served the earlier turns has their pages cached
# (only full pages outside the recent window are cached: the sinks and the INT2 history).
PROMPT=$("$OSCAR" tokenize --model "$MODEL" "$(printf 'You are a careful assistant. %.0s' $(seq 12))" 2>/dev/null | tail -1)
SESSIONS=(alice bob carol dave erin frank)
python3 - "$LB" "$PROMPT" "$TMP/routes.txt" "${SESSIONS[@]}" <<'PY'
import json, sys, urllib.request
lb, prompt, out_path, sessions = sys.argv[1], [int(t) for t in sys.argv[2].split()], sys.argv[3], sys.argv[4:]
rows = []
for s in sessions:
    # A shared preamble, then ~300 tokens of the session's own context: long enough that pages
    # leave the recent window (--n-recent 256) for the INT2 history, which the prefix cache shares.
    ids = list(prompt) + [1000 + sessions.index(s)] * 300
    for turn in range(3):
        body = json.dumps({"input_ids": ids, "max_tokens": 8, "temperature": 0,
                           "ignore_eos": True}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{lb}/v1/generate", body,
                                     {"Content-Type": "application/json", "X-Session-Id": s})
        with urllib.request.urlopen(req, timeout=60) as r:
            upstream = r.headers.get("X-Oscar-Upstream")
            ans = json.load(r)
        u = ans["usage"]
        rows.append((s, turn, upstream, u["prompt_tokens"], u["prompt_tokens_details"]["cached_tokens"],
                     u["completion_tokens"]))
        print(f"session={s:<6} turn={turn} upstream={upstream} prompt_tokens={u['prompt_tokens']} "
              f"cached_tokens={u['prompt_tokens_details']['cached_tokens']} "
              f"completion_tokens={u['completion_tokens']}")
        ids = ids + ans["output_ids"] + [2000 + turn] * 8
with open(out_path, "w") as f:
    for r in rows:
        f.write(" ".join(str(x) for x in r) + "\n")
PY

after=()
for port in "${PORTS[@]}"; do after+=("$(gen_tokens "$port")"); done
python3 - "$TMP/routes.txt" "${PORTS[0]}" "${PORTS[1]}" "${before[@]}" "${after[@]}" <<'PY'
import sys
from collections import defaultdict
rows = [l.split() for l in open(sys.argv[1])]
ports = sys.argv[2:4]
before = [float(x) for x in sys.argv[4:6]]
after = [float(x) for x in sys.argv[6:8]]
by_session = defaultdict(set)
tokens_via_header = defaultdict(int)
for s, turn, upstream, prompt, cached, completion in rows:
    by_session[s].add(upstream)
    tokens_via_header[upstream.rsplit(":", 1)[1]] += int(completion)
ok = True
for s, ups in by_session.items():
    status = "ok" if len(ups) == 1 else "SPLIT"
    ok = ok and len(ups) == 1
    print(f"check: session {s:<6} -> {', '.join(sorted(ups))} {status}")
for i, p in enumerate(ports):
    delta = int(after[i] - before[i])
    match = delta == tokens_via_header[p]
    ok = ok and match
    print(f"check: replica :{p} oscar_generation_tokens_total +{delta}, "
          f"tokens of the sessions nginx sent there {tokens_via_header[p]} "
          f"{'ok' if match else 'MISMATCH'}")
used = {u for ups in by_session.values() for u in ups}
print(f"replicas used: {len(used)} of 2")
later = [r for r in rows if r[1] != "0"]
hit = sum(1 for r in later if int(r[4]) > 0)
print(f"later turns with cached prompt tokens: {hit} of {len(later)}")
print("PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
PY
