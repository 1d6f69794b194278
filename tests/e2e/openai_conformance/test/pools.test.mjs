// Bad input and cancellation leave nothing behind: after requests cancelled mid-prefill and
// mid-decode and a series of invalid requests, the server returns to its idle level (no running
// or waiting request, no KV page in use: run.sh starts the server without the prefix cache), as
// /metrics reports, and still answers.
//
// Environment: OSCAR_SERVER_URL (required), OSCAR_API_KEY (optional).
import { test } from 'node:test';
import assert from 'node:assert/strict';

const base = process.env.OSCAR_SERVER_URL;
const headers = { 'Content-Type': 'application/json' };
if (process.env.OSCAR_API_KEY) headers.Authorization = `Bearer ${process.env.OSCAR_API_KEY}`;

async function metrics() {
  const out = {};
  for (const line of (await (await fetch(`${base}/metrics`)).text()).split('\n')) {
    if (line && !line.startsWith('#')) {
      const i = line.lastIndexOf(' ');
      out[line.slice(0, i)] = Number(line.slice(i + 1));
    }
  }
  return out;
}

function pagesUsed(m) {
  return Object.entries(m).filter(([k]) => k.startsWith('oscar_kv_pages_used')).reduce((a, [, v]) => a + v, 0);
}

async function waitIdle() {
  const deadline = Date.now() + 60_000;
  let m;
  do {
    m = await metrics();
    if (m.oscar_requests_running === 0 && m.oscar_requests_waiting === 0 && pagesUsed(m) === 0) return m;
    await new Promise((r) => setTimeout(r, 100));
  } while (Date.now() < deadline);
  assert.fail(`not idle: ${JSON.stringify(m)}`);
}

async function model() {
  return (await (await fetch(`${base}/v1/models`, { headers })).json()).data[0].id;
}

// Starts a streaming completion and aborts it after `chunks` SSE chunks (0: after `ms`).
async function abortedStream(body, { chunks = 0, ms = 0 }) {
  const ctrl = new AbortController();
  if (ms) setTimeout(() => ctrl.abort(), ms);
  try {
    const res = await fetch(`${base}/v1/completions`, {
      method: 'POST', headers, body: JSON.stringify({ ...body, stream: true }), signal: ctrl.signal,
    });
    let n = 0;
    for await (const _ of res.body) {
      if (chunks && ++n >= chunks) { ctrl.abort(); break; }
    }
  } catch (e) {
    if (e.name !== 'AbortError') throw e;
  }
}

test('cancelled mid-prefill and mid-decode, then bad input: pools back to idle', async () => {
  const m = await model();
  await waitIdle();
  // Mid-prefill: a long prompt, abandoned after 200 ms.
  const longPrompt = 'def f(x):\n    return [i * x for i in range(10)]\n\n'.repeat(400);
  await abortedStream({ model: m, prompt: longPrompt, max_tokens: 4 }, { ms: 200 });
  // Mid-decode: a long generation abandoned after a few chunks.
  await abortedStream({ model: m, prompt: 'import os\n', max_tokens: 4000, ignore_eos: true,
                        temperature: 0 }, { chunks: 3 });
  // Bad input of many kinds: each is a 4xx in OpenAI's error format.
  const bad = [
    '{"model": ', JSON.stringify({ model: m, messages: [] }),
    JSON.stringify({ model: m, messages: 'hi' }), JSON.stringify({ model: 'nope', prompt: 'x' }),
    JSON.stringify({ model: m, prompt: 'x', max_tokens: 10_000_000 }),
    JSON.stringify({ model: m, prompt: [999999999] }),
    JSON.stringify({ model: m, prompt: 'x', stop: ['a', 'b', 'c', 'd', 'e'] }),
    JSON.stringify({ model: m, prompt: 'x', temperature: -1 }),
    '['.repeat(1000) + ']'.repeat(1000),
  ];
  for (const body of bad) {
    const path = body.includes('messages') ? 'chat/completions' : 'completions';
    const res = await fetch(`${base}/v1/${path}`, { method: 'POST', headers, body });
    assert.ok(res.status >= 400 && res.status < 500, `status ${res.status} for ${body.slice(0, 60)}`);
    const err = await res.json();
    assert.equal(typeof err.error.message, 'string');
  }
  const idle = await waitIdle();
  assert.equal(pagesUsed(idle), 0);
  // Still serving.
  const res = await fetch(`${base}/v1/completions`, {
    method: 'POST', headers, body: JSON.stringify({ model: m, prompt: 'x = 1\n', max_tokens: 2 }),
  });
  assert.equal(res.status, 200);
});
