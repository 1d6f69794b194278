#!/usr/bin/env python3
"""Prefill as a client of `oscar serve` sees it (issue 26 item 6): time to first token of long
prompts, the shared-prefix load test, and the inter-token latency of running streams while a
long prompt prefills. Through the token-level endpoint /v1/generate (token ids in, one SSE event
per sampled token out). Python's standard library only (runs on the GPU machine as it is).

  serve_prefill.py --url http://127.0.0.1:PORT --out FILE.json [--ttft 8192,32768,102400]
      [--shared 32x16384+64/256] [--itl 8x102400]

ttft:   one request at a time of N random token ids (fresh ids every run: no prefix-cache hit),
        max_tokens 1, streamed; the time from sending to the first token's SSE chunk. Two runs
        each up to 32K (one above), all printed; the reported value is the fastest (the first run
        of a server includes its one-off warm-up: cuBLASLt plans, pools touched).
shared: R concurrent streamed requests over one shared prefix of P random token ids, each with
        U unique tokens and O output tokens (ignore_eos); one request of the prefix first (it
        warms the prefix cache, as a long-lived system prompt would). Reported: output tokens/s
        over the wall time of the R requests, TTFT p50/p90.
itl:    S streams decoding (short prompts, many output tokens), then one prompt of N tokens;
        the gaps between the streams' tokens before the long prompt arrives (undisturbed) and
        while it prefills (until its first token): p50 / p99 / max.
"""
import argparse, http.client, json, random, statistics, sys, threading, time
from urllib.parse import urlparse


def stream_completion(url, ids, max_tokens, on_token=None, ignore_eos=True):
    """POST /v1/generate (token ids in and out, streamed: one event per sampled token, whatever
    its text; dummy weights sample ids the tokenizer may render as nothing). Returns
    (t_send, [t_token...]) with perf_counter times."""
    u = urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=3600)
    body = json.dumps(dict(input_ids=ids, max_tokens=max_tokens, stream=True, temperature=0,
                           ignore_eos=ignore_eos))
    t0 = time.perf_counter()
    conn.request("POST", "/v1/generate", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
    times = []
    buf = b""
    while True:
        chunk = resp.read1(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            if not ev.startswith(b"data: "):
                continue
            data = ev[6:]
            if data == b"[DONE]":
                conn.close()
                return t0, times
            obj = json.loads(data)
            if "error" in obj:
                raise RuntimeError(f"error event: {obj['error']}")
            now = time.perf_counter()
            for _ in obj.get("output_ids", []):
                times.append(now)
                if on_token:
                    on_token(now)
    conn.close()
    return t0, times


def rand_ids(rng, n, vocab):
    return [rng.randrange(10, vocab) for _ in range(n)]


def pct(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))]


def run_ttft(url, lens, vocab, rng):
    rows = []
    for n in lens:
        runs = []
        for _ in range(2 if n <= 32768 else 1):
            t0, ts = stream_completion(url, rand_ids(rng, n, vocab), 1)
            runs.append(ts[0] - t0)
        rows.append(dict(tokens=n, ttft_s=round(min(runs), 3), runs_s=[round(x, 3) for x in runs]))
        print(json.dumps(rows[-1]), flush=True)
    return rows


def run_shared(url, spec, vocab, rng):
    r, rest = spec.split("x")
    p, rest = rest.split("+")
    uq, o = rest.split("/")
    r, p, uq, o = int(r), int(p), int(uq), int(o)
    prefix = rand_ids(rng, p, vocab)
    stream_completion(url, prefix + rand_ids(rng, uq, vocab), 1)  # the prefix cached
    results = [None] * r

    def one(i, ids):
        results[i] = stream_completion(url, ids, o)

    prompts = [prefix + rand_ids(rng, uq, vocab) for _ in range(r)]
    threads = [threading.Thread(target=one, args=(i, prompts[i])) for i in range(r)]
    t_start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t_start
    toks = sum(len(res[1]) for res in results)
    ttfts = [res[1][0] - res[0] for res in results]
    row = dict(requests=r, prefix=p, unique=uq, output=o, output_tokens=toks,
               wall_s=round(wall, 3), output_tok_s=round(toks / wall, 1),
               ttft_p50_s=round(pct(ttfts, 0.5), 3), ttft_p90_s=round(pct(ttfts, 0.9), 3))
    print(json.dumps(row), flush=True)
    return row


def run_itl(url, spec, vocab, rng):
    s, n = (int(x) for x in spec.split("x"))
    lock = threading.Lock()
    stamps = [[] for _ in range(s)]
    stop_at = [None]

    def stream(i):
        def on_tok(t):
            with lock:
                stamps[i].append(t)
        stream_completion(url, rand_ids(rng, 32, vocab), 100000, on_token=on_tok)

    # The streams run until the server's max-model-len or until cancelled by the process exit.
    threads = [threading.Thread(target=stream, args=(i,), daemon=True) for i in range(s)]
    for t in threads:
        t.start()
    time.sleep(8.0)  # the streams reach steady decode
    t_long = time.perf_counter()
    t0, ts = stream_completion(url, rand_ids(rng, n, vocab), 1)
    t_first = ts[0]
    time.sleep(1.0)
    with lock:
        snap = [list(x) for x in stamps]

    def gaps(lo, hi):
        out = []
        for st in snap:
            prev = None
            for t in st:
                if prev is not None and lo <= t <= hi:
                    out.append(t - prev)
                prev = t if t >= lo - 10 else None
        return out

    before = gaps(t_long - 5.0, t_long)
    during = gaps(t_long, t_first)
    row = dict(streams=s, long_prompt=n, long_ttft_s=round(t_first - t0, 3),
               undisturbed_ms=dict(p50=round(1e3 * pct(before, 0.5), 2),
                                   p99=round(1e3 * pct(before, 0.99), 2)),
               during_ms=dict(p50=round(1e3 * pct(during, 0.5), 2),
                              p99=round(1e3 * pct(during, 0.99), 2),
                              max=round(1e3 * max(during), 2) if during else None,
                              n=len(during)))
    row["p99_ratio"] = round(row["during_ms"]["p99"] / row["undisturbed_ms"]["p50"], 2)
    print(json.dumps(row), flush=True)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--vocab", type=int, default=1000, help="token ids drawn from [10, vocab)")
    ap.add_argument("--ttft", default="", help="comma-separated prompt lengths")
    ap.add_argument("--shared", default="", help="RxP+U/O, e.g. 32x16384+64/256")
    ap.add_argument("--itl", default="", help="SxN, e.g. 8x102400")
    ap.add_argument("--tag", default="")
    a = ap.parse_args()
    rng = random.Random(1234)
    res = dict(tag=a.tag, date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    if a.ttft:
        res["ttft"] = run_ttft(a.url, [int(x) for x in a.ttft.split(",")], a.vocab, rng)
    if a.shared:
        res["shared"] = run_shared(a.url, a.shared, a.vocab, rng)
    if a.itl:
        res["itl"] = run_itl(a.url, a.itl, a.vocab, rng)
    json.dump(res, open(a.out, "w"), indent=1)
    sys.stdout.flush()
    # Daemon stream threads may still be reading: leave without waiting for them.
    import os
    os._exit(0)


if __name__ == "__main__":
    main()
