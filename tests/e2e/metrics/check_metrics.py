#!/usr/bin/env python3
"""GET /metrics of a real `oscar serve`, parsed by the Prometheus project's own Python parser
(prometheus_client.parser, Debian's python3-prometheus-client), not by code written here.

    check_metrics.py OSCAR_BINARY [SERVE_ARGS...]

Starts `OSCAR_BINARY serve SERVE_ARGS... --host 127.0.0.1 --port PORT` on a free loopback port and
checks, as a router that scrapes vLLM reads them:
  - before any request: every family parses; vllm:cache_config_info carries block_size and the
    served model name, vllm:kv_cache_usage_perc is 0, the page gauges list every pool;
  - the prefix-cache counters are counters named as vLLM's (family vllm:prefix_cache_queries,
    sample vllm:prefix_cache_queries_total), as prometheus_client exposes vLLM's own;
  - after the same long prompt twice, idle: the cache holds pages (oscar_kv_pages_cached) but
    vllm:kv_cache_usage_perc reads 0 (evictable pages are free, as in vLLM), and the hits count.
Exits 0 when every check holds, 1 (naming the failed check) otherwise.
"""
import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def scrape(url):
    text = urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    samples = {}
    for f in families.values():
        for s in f.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return families, samples


def value(samples, name, **labels):
    key = (name, tuple(sorted(labels.items())))
    if key not in samples:
        raise AssertionError(f"no sample {name}{labels}")
    return samples[key]


def pool_sum(samples, name):
    return sum(v for (n, _), v in samples.items() if n == name)


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tempfile.TemporaryFile()
    server = subprocess.Popen(
        [sys.argv[1], "serve", *sys.argv[2:], "--host", "127.0.0.1", "--port", str(port)],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 120
        while True:
            try:
                if urllib.request.urlopen(url + "/health", timeout=5).status == 200:
                    break
            except OSError:
                pass
            if server.poll() is not None or time.time() > deadline:
                raise AssertionError("the server did not become ready")
            time.sleep(0.2)
        model = json.loads(urllib.request.urlopen(url + "/v1/models").read())["data"][0]["id"]

        families, samples = scrape(url)
        m = {"model_name": model}
        check(value(samples, "vllm:kv_cache_usage_perc", **m) == 0, "usage before requests")
        check(families["vllm:kv_cache_usage_perc"].type == "gauge", "usage is a gauge")
        info = [s for s in families["vllm:cache_config_info"].samples]
        check(len(info) == 1 and int(info[0].labels["block_size"]) > 0 and
              info[0].labels["model_name"] == model, f"cache_config_info {info}")
        for name in ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits",
                     "vllm:num_preemptions"):
            check(families[name].type == "counter", f"{name} is a counter")
            check(families[name].samples[0].name == name + "_total", f"{name}_total sample")
        pools = {s.labels["pool"] for s in families["oscar_kv_pages_total"].samples}
        check(len(pools) >= 1 and all(value(samples, "oscar_kv_pages_total", pool=p) > 0
                                      for p in pools), f"page totals {pools}")
        check(pool_sum(samples, "oscar_kv_pages_cached") == 0, "nothing cached yet")

        prompt = "def add(a, b):\n    return a + b\n\n" * 80
        body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 4}).encode()
        for _ in range(2):
            req = urllib.request.Request(url + "/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            check(urllib.request.urlopen(req, timeout=120).status == 200, "completion")
        for _ in range(100):  # the snapshot follows the request's end within a loop iteration
            _, samples = scrape(url)
            if value(samples, "vllm:num_requests_running", **m) == 0 and \
                    value(samples, "vllm:kv_cache_usage_perc", **m) == 0:
                break
            time.sleep(0.05)
        cached = pool_sum(samples, "oscar_kv_pages_cached")
        check(cached > 0, "the prompt's pages are in the prefix cache")
        check(pool_sum(samples, "oscar_kv_pages_evictable") == cached, "idle: all evictable")
        check(value(samples, "vllm:kv_cache_usage_perc", **m) == 0, "idle warm usage is 0")
        queries = value(samples, "vllm:prefix_cache_queries_total", **m)
        hits = value(samples, "vllm:prefix_cache_hits_total", **m)
        check(0 < hits <= queries, f"hits {hits} of {queries} queried tokens")
        print(f"check_metrics: ok ({len(families)} families; {cached:.0f} cached pages, "
              f"usage 0, hits {hits:.0f} / {queries:.0f})")
        return 0
    except AssertionError as e:
        print(f"check_metrics: FAILED: {e}", file=sys.stderr)
        log.seek(0)
        sys.stderr.write(log.read().decode(errors="replace")[-3000:])
        return 1
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()


if __name__ == "__main__":
    sys.exit(main())
