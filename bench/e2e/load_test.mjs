// Bounded load test of an OpenAI-compatible server (not a unit test): N concurrent streaming chat
// requests that share a long system prompt. Prints one JSON object: requests/s, tokens/s, time
// to first token and per output token (p50/p99), failures, the most requests the server ran at
// once (and the mean over the run) and the most pages each KV pool had in use (sampled from
// /metrics every 100 ms), the preemptions during the run (oscar_preemptions_total: running
// requests whose pool ran dry), prefix-cache hit rate and KV pool levels after the run.
//
//   node bench/e2e/load_test.mjs --url http://127.0.0.1:8000 --requests 64 --concurrency 64 \
//        --system-file models/tiny-qwen3/data/calib.txt --system-chars 4000 --max-tokens 32
import { readFileSync } from 'node:fs';
import http from 'node:http';

const args = Object.fromEntries(process.argv.slice(2).reduce((acc, a, i, all) => {
  if (a.startsWith('--')) acc.push([a.slice(2), all[i + 1]]);
  return acc;
}, []));
const url = args.url ?? 'http://127.0.0.1:8000';
const nRequests = Number(args.requests ?? 64);
const concurrency = Number(args.concurrency ?? 64);
const maxTokens = Number(args['max-tokens'] ?? 32);
const timeoutMs = Number(args['timeout-s'] ?? 1800) * 1000;
const system = readFileSync(args['system-file'] ?? 'models/tiny-qwen3/data/calib.txt', 'utf8')
  .slice(0, Number(args['system-chars'] ?? 4000));
const headers = { 'Content-Type': 'application/json' };
if (args['api-key']) headers.Authorization = `Bearer ${args['api-key']}`;

async function metrics() {
  const text = await (await fetch(`${url}/metrics`)).text();
  const out = {};
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const [k, v] = line.split(' ');
    out[k] = Number(v);
  }
  return out;
}

const model = (await (await fetch(`${url}/v1/models`, { headers })).json()).data[0].id;
const before = await metrics();
let maxRunning = 0;
let maxWaiting = 0;
let runningSum = 0, samples = 0;  // the mean of the running count over the run
const pagesPeak = {};  // oscar_kv_pages_used{pool=...} -> the most seen
let polling = true;
const poller = (async () => {
  while (polling) {
    try {
      const m = await metrics();
      maxRunning = Math.max(maxRunning, m.oscar_requests_running ?? 0);
      runningSum += m.oscar_requests_running ?? 0;
      samples += 1;
      maxWaiting = Math.max(maxWaiting, m.oscar_requests_waiting ?? 0);
      for (const [k, v] of Object.entries(m))
        if (k.startsWith('oscar_kv_pages_used')) pagesPeak[k] = Math.max(pagesPeak[k] ?? 0, v);
    } catch {}
    await new Promise((r) => setTimeout(r, 100));
  }
})();

async function one(i) {
  const t0 = performance.now();
  const body = {
    model, stream: true, stream_options: { include_usage: true },
    ...(maxTokens > 0 ? { max_tokens: maxTokens } : {}),  // 0: leave it out, as clients do by default
    temperature: 0,
    messages: [{ role: 'system', content: system },
               { role: 'user', content: `Question ${i}: what does the function on line ${i} do?` }],
  };
  // node:http, not fetch: fetch (undici) cuts a response body after 300 s without a byte, which
  // a streamed request queued behind a long first wave reaches (the server sends its role chunk,
  // then nothing until admitted); this client waits up to --timeout-s for the whole request.
  const res = await new Promise((resolve, reject) => {
    const req = http.request(`${url}/v1/chat/completions`, {
      method: 'POST', headers, signal: AbortSignal.timeout(timeoutMs),
    }, resolve);
    req.on('error', reject);
    req.end(JSON.stringify(body));
  });
  if (res.statusCode !== 200) {
    let text = '';
    for await (const c of res) text += c;
    throw new Error(`HTTP ${res.statusCode}: ${text}`);
  }
  const decoder = new TextDecoder();
  let buf = '', first = null, last = null, done = false, usage = null;
  const gaps = [];
  for await (const chunk of res) {
    buf += decoder.decode(chunk, { stream: true });
    let k;
    while ((k = buf.indexOf('\n\n')) >= 0) {
      const event = buf.slice(0, k);
      buf = buf.slice(k + 2);
      if (!event.startsWith('data: ')) continue;
      const data = event.slice(6);
      if (data === '[DONE]') { done = true; continue; }
      const j = JSON.parse(data);
      if (j.usage) usage = j.usage;
      if (j.choices?.length && j.choices[0].delta?.content) {  // first text, not the role chunk
        const now = performance.now();
        if (first === null) first = now; else gaps.push(now - last);
        last = now;
      }
    }
  }
  if (!done) throw new Error('stream ended without [DONE]');
  return { ttft: (first - t0) / 1000, gaps: gaps.map((g) => g / 1000), usage, total: (last - t0) / 1000 };
}

const t0 = performance.now();
const results = [];
const failures = [];
let next = 0;
await Promise.all(Array.from({ length: concurrency }, async () => {
  while (next < nRequests) {
    const i = next++;
    try { results.push(await one(i)); } catch (e) { failures.push(`${e}${e.cause ? ` (${e.cause})` : ''}`); }
  }
}));
const wall = (performance.now() - t0) / 1000;
polling = false;
await poller;
await new Promise((r) => setTimeout(r, 300));
const after = await metrics();

const pct = (xs, p) => {
  if (!xs.length) return null;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(p * s.length))];
};
const outTokens = results.reduce((a, r) => a + (r.usage?.completion_tokens ?? 0), 0);
const promptTokens = results.reduce((a, r) => a + (r.usage?.prompt_tokens ?? 0), 0);
const cachedTokens = results.reduce((a, r) => a + (r.usage?.prompt_tokens_details?.cached_tokens ?? 0), 0);
const tpot = results.flatMap((r) => r.gaps);
console.log(JSON.stringify({
  requests: nRequests, concurrency, ok: results.length, failed: failures.length,
  failures: failures.slice(0, 5), wall_s: wall,
  requests_per_s: results.length / wall, output_tokens_per_s: outTokens / wall,
  prompt_tokens: promptTokens, cached_prompt_tokens: cachedTokens, output_tokens: outTokens,
  ttft_p50_s: pct(results.map((r) => r.ttft), 0.5), ttft_p99_s: pct(results.map((r) => r.ttft), 0.99),
  tpot_p50_s: pct(tpot, 0.5), tpot_p99_s: pct(tpot, 0.99),
  max_running: maxRunning, mean_running: samples ? runningSum / samples : null, max_waiting: maxWaiting,
  pages_used_peak: pagesPeak,
  preemptions: (after.oscar_preemptions_total ?? NaN) - (before.oscar_preemptions_total ?? 0),
  prefix_cache_hit_rate: after.oscar_prefix_cache_hit_rate,
  pools_after: Object.fromEntries(Object.entries(after).filter(([k]) => k.startsWith('oscar_kv_pages'))),
  requests_running_after: after.oscar_requests_running, requests_waiting_after: after.oscar_requests_waiting,
}, null, 2));
process.exit(failures.length ? 1 : 0);
