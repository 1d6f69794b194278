// OpenAI conformance: drives an oscar server with the official `openai` client and checks that
// responses, streams and errors have the shapes the client (and its users) rely on. Written to
// pass against any model: contents are checked for shape and self-consistency (streamed text
// equals the non-streamed text at temperature 0), not for particular words.
//
// Environment: OSCAR_SERVER_URL (e.g. http://127.0.0.1:8123, required), OSCAR_API_KEY (the key the
// server was started with, optional). run.sh sets both.
import { test, before } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const baseURL = process.env.OSCAR_SERVER_URL;
if (!baseURL) throw new Error('set OSCAR_SERVER_URL to the server, e.g. http://127.0.0.1:8123');
const apiKey = process.env.OSCAR_API_KEY || 'unused';
const client = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey, maxRetries: 0, timeout: 60_000 });

let model;
let maxModelLen;
const messages = [{ role: 'user', content: 'Say hello.' }];

function checkUsage(usage) {
  assert.ok(Number.isInteger(usage.prompt_tokens) && usage.prompt_tokens > 0);
  assert.ok(Number.isInteger(usage.completion_tokens) && usage.completion_tokens >= 0);
  assert.equal(usage.total_tokens, usage.prompt_tokens + usage.completion_tokens);
}

async function expectApiError(promise, status, check = () => {}) {
  await assert.rejects(promise, (err) => {
    assert.ok(err instanceof OpenAI.APIError, `expected an APIError, got ${err}`);
    assert.equal(err.status, status, `status ${err.status}: ${err.message}`);
    assert.equal(typeof err.error?.message, 'string');
    check(err);
    return true;
  });
}

before(async () => {
  const list = await client.models.list();
  assert.ok(list.data.length >= 1, 'no model listed');
  model = list.data[0].id;
  maxModelLen = list.data[0].max_model_len;
});

test('GET /v1/models lists the served model', async () => {
  const list = await client.models.list();
  assert.equal(list.data[0].object, 'model');
  assert.equal(typeof list.data[0].id, 'string');
  const one = list.data.find((m) => m.id === model);
  assert.ok(one);
});

test('GET /health answers 200 when ready', async () => {
  const res = await fetch(`${baseURL}/health`);
  assert.equal(res.status, 200);
});

test('chat completion, non-streaming', async () => {
  const r = await client.chat.completions.create({
    model, messages, max_tokens: 8, temperature: 0,
  });
  assert.match(r.id, /^chatcmpl-/);
  assert.equal(r.object, 'chat.completion');
  assert.ok(Number.isInteger(r.created));
  assert.equal(r.model, model);
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].index, 0);
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(typeof r.choices[0].message.content, 'string');
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
  checkUsage(r.usage);
  assert.ok(r.usage.completion_tokens <= 8);
});

test('chat completion, streaming with usage, matches non-streaming at temperature 0', async () => {
  const params = { model, messages, max_tokens: 8, temperature: 0, seed: 1 };
  const whole = await client.chat.completions.create(params);
  const stream = await client.chat.completions.create({
    ...params, stream: true, stream_options: { include_usage: true },
  });
  let text = '';
  let first = true;
  let finish = null;
  let usage = null;
  let id = null;
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'chat.completion.chunk');
    id ??= chunk.id;
    assert.equal(chunk.id, id);
    if (chunk.usage) {
      assert.equal(chunk.choices.length, 0);
      usage = chunk.usage;
      continue;
    }
    const choice = chunk.choices[0];
    if (first) {
      assert.equal(choice.delta.role, 'assistant');
      first = false;
    }
    text += choice.delta.content ?? '';
    if (choice.finish_reason) finish = choice.finish_reason;
  }
  assert.match(id, /^chatcmpl-/);
  assert.equal(text, whole.choices[0].message.content);
  assert.equal(finish, whole.choices[0].finish_reason);
  assert.ok(usage, 'include_usage: no usage chunk');
  checkUsage(usage);
  assert.equal(usage.completion_tokens, whole.usage.completion_tokens);
});

test('chat streaming without include_usage sends no usage', async () => {
  const stream = await client.chat.completions.create({
    model, messages, max_tokens: 4, temperature: 0, stream: true,
  });
  for await (const chunk of stream) assert.ok(!chunk.usage);
});

test('text completion, non-streaming and streaming agree', async () => {
  const params = { model, prompt: 'The capital of France is', max_tokens: 6, temperature: 0 };
  const r = await client.completions.create(params);
  assert.match(r.id, /^cmpl-/);
  assert.equal(r.object, 'text_completion');
  assert.equal(r.choices.length, 1);
  assert.equal(typeof r.choices[0].text, 'string');
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
  checkUsage(r.usage);
  assert.ok(r.usage.completion_tokens <= 6);

  const stream = await client.completions.create({ ...params, stream: true });
  let text = '';
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'text_completion');
    text += chunk.choices[0]?.text ?? '';
  }
  assert.equal(text, r.choices[0].text);
});

test('responses: text input, non-streaming and streaming agree', async () => {
  const params = { model, instructions: 'Be brief.', input: 'Say hello.', max_output_tokens: 6, temperature: 0 };
  const r = await client.responses.create(params);
  assert.match(r.id, /^resp_/);
  assert.equal(r.object, 'response');
  assert.ok(['completed', 'incomplete'].includes(r.status));
  assert.equal(typeof r.output_text, 'string');  // the client's own accessor over output
  assert.ok(r.usage.output_tokens <= 6);
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);

  const stream = await client.responses.create({ ...params, stream: true });
  let text = '';
  let done;
  for await (const ev of stream) {
    if (ev.type === 'response.output_text.delta') text += ev.delta;
    if (ev.type === 'response.completed' || ev.type === 'response.incomplete') done = ev.response;
  }
  assert.equal(text, r.output_text);
  assert.equal(done.output[0].content[0].text, text);
});

test('responses: message input with content parts', async () => {
  const r = await client.responses.create({
    model,
    max_output_tokens: 4,
    input: [
      { role: 'developer', content: 'Be brief.' },
      { role: 'user', content: [{ type: 'input_text', text: 'Say hello.' }] },
    ],
  });
  assert.equal(r.output[0].type, 'message');
  assert.equal(r.output[0].content[0].type, 'output_text');
});

test('text completion from token ids', async () => {
  const r = await client.completions.create({ model, prompt: [1, 2, 3], max_tokens: 2, temperature: 0 });
  assert.equal(r.usage.prompt_tokens, 3);
});

test('max_tokens = 1 stops at length or earlier', async () => {
  const r = await client.completions.create({
    model, prompt: 'Once upon a time', max_tokens: 1, temperature: 0,
  });
  assert.ok(r.usage.completion_tokens <= 1);
  if (r.usage.completion_tokens === 1 && r.choices[0].finish_reason !== 'stop') {
    assert.equal(r.choices[0].finish_reason, 'length');
  }
});

test('error: unknown model is 404 model_not_found', async () => {
  await expectApiError(
    client.chat.completions.create({ model: 'no-such-model', messages }),
    404,
    (err) => assert.equal(err.code, 'model_not_found'),
  );
});

test('error: n beyond 16 and best_of are 400 naming them', async () => {
  await expectApiError(
    client.chat.completions.create({ model, messages, n: 17 }),
    400,
    (err) => assert.equal(err.param, 'n'),
  );
  await expectApiError(
    client.completions.create({ model, prompt: 'x', best_of: 2 }),
    400,
    (err) => assert.equal(err.param, 'best_of'),
  );
});

test('logprobs: chat top_logprobs and completions logprobs, whole and streamed', async () => {
  const params = { model, messages, max_tokens: 6, temperature: 0, logprobs: true, top_logprobs: 3 };
  const r = await client.chat.completions.create(params);
  const content = r.choices[0].logprobs.content;
  assert.ok(content.length >= 1 && content.length <= r.usage.completion_tokens);
  for (const e of content) {
    assert.equal(typeof e.token, 'string');
    assert.ok(e.logprob <= 0);
    assert.ok(Array.isArray(e.bytes));
    assert.equal(e.top_logprobs.length, 3);
    assert.equal(e.top_logprobs[0].logprob, e.logprob);  // greedy: the most likely token
  }
  const stream = await client.chat.completions.create({ ...params, stream: true });
  const streamed = [];
  for await (const chunk of stream) streamed.push(...(chunk.choices[0]?.logprobs?.content ?? []));
  assert.deepEqual(streamed.map((e) => e.token), content.map((e) => e.token));

  const c = await client.completions.create({
    model, prompt: 'The capital of France is', max_tokens: 5, temperature: 0, logprobs: 2,
  });
  const lp = c.choices[0].logprobs;
  assert.equal(lp.tokens.length, lp.token_logprobs.length);
  assert.equal(lp.tokens.length, lp.text_offset.length);
  assert.equal(lp.tokens.length, lp.top_logprobs.length);
  assert.ok(Object.keys(lp.top_logprobs[0]).length >= 1);
  await expectApiError(
    client.chat.completions.create({ model, messages, top_logprobs: 2 }),
    400,
    (err) => assert.equal(err.param, 'top_logprobs'),
  );
});

test('n = 2: greedy choices are equal, streamed with their index', async () => {
  const params = { model, messages, max_tokens: 6, temperature: 0, n: 2 };
  const r = await client.chat.completions.create(params);
  assert.equal(r.choices.length, 2);
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1]);
  assert.equal(r.choices[0].message.content, r.choices[1].message.content);
  const stream = await client.chat.completions.create({ ...params, stream: true });
  const text = ['', ''];
  for await (const chunk of stream) {
    for (const c of chunk.choices) text[c.index] += c.delta.content ?? '';
  }
  assert.deepEqual(text, [r.choices[0].message.content, r.choices[1].message.content]);
});

test('penalties are accepted; out of range is 400 naming them', async () => {
  const r = await client.chat.completions.create({
    model, messages, max_tokens: 4, presence_penalty: 0.5, frequency_penalty: 0.5,
  });
  assert.equal(r.choices.length, 1);
  await expectApiError(
    client.chat.completions.create({ model, messages, presence_penalty: 3 }),
    400,
    (err) => assert.equal(err.param, 'presence_penalty'),
  );
});

const tools = [
  { type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } } },
  { type: 'function', function: { name: 'get_time', parameters: { type: 'object', properties: {} } } },
];

test('tool_choice required and named: a valid call comes back, whole and streamed', async () => {
  for (const [toolChoice, names] of [
    ['required', ['get_weather', 'get_time']],
    [{ type: 'function', function: { name: 'get_time' } }, ['get_time']],
  ]) {
    const params = {
      model, messages: [{ role: 'user', content: 'What time is it?' }], tools,
      tool_choice: toolChoice, max_tokens: 64, temperature: 0,
    };
    const r = await client.chat.completions.create(params);
    const choice = r.choices[0];
    assert.equal(choice.finish_reason, 'tool_calls', JSON.stringify(choice));
    assert.equal(choice.message.tool_calls.length, 1);
    const call = choice.message.tool_calls[0];
    assert.equal(call.type, 'function');
    assert.ok(names.includes(call.function.name), call.function.name);
    assert.equal(typeof JSON.parse(call.function.arguments), 'object');

    const stream = await client.chat.completions.create({ ...params, stream: true });
    let streamedName = null;
    let finish = null;
    for await (const chunk of stream) {
      const c = chunk.choices[0];
      if (!c) continue;
      for (const tc of c.delta.tool_calls ?? []) {
        streamedName ??= tc.function?.name;
        JSON.parse(tc.function.arguments);
      }
      finish = c.finish_reason ?? finish;
    }
    assert.equal(streamedName, call.function.name);
    assert.equal(finish, 'tool_calls');
  }
  await expectApiError(
    client.chat.completions.create({ model, messages, tool_choice: 'required' }),
    400,
    (err) => assert.equal(err.param, 'tool_choice'),
  );
});

test('error: empty messages, bad temperature, too many stops are 400', async () => {
  await expectApiError(client.chat.completions.create({ model, messages: [] }), 400);
  await expectApiError(client.chat.completions.create({ model, messages, temperature: -1 }), 400,
    (err) => assert.equal(err.param, 'temperature'));
  await expectApiError(
    client.chat.completions.create({ model, messages, stop: ['a', 'b', 'c', 'd', 'e'] }), 400,
    (err) => assert.equal(err.param, 'stop'));
});

test('error: max_tokens beyond the context is 400 with the numbers', async () => {
  const tooMany = (maxModelLen ?? 1_000_000) + 1;
  await expectApiError(
    client.chat.completions.create({ model, messages, max_tokens: tooMany }),
    400,
    (err) => assert.match(err.message, /maximum context length/),
  );
});

test('error: malformed JSON is 400 in OpenAI format', async () => {
  const res = await fetch(`${baseURL}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${apiKey}` },
    body: '{"model": ',
  });
  assert.equal(res.status, 400);
  const body = await res.json();
  assert.equal(body.error.type, 'invalid_request_error');
  assert.equal(typeof body.error.message, 'string');
});

test('error: wrong API key is 401 when the server has one', { skip: !process.env.OSCAR_API_KEY }, async () => {
  const bad = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey: 'wrong', maxRetries: 0 });
  await expectApiError(bad.models.list(), 401);
});

test('aborting a stream mid-way cancels it and leaves the server healthy', async () => {
  // ignore_eos (extension) and most of the context: long enough that the abort lands mid-stream.
  const maxTokens = Math.max(16, Math.min(4096, (maxModelLen ?? 256) - 128));
  const stream = await client.chat.completions.create({
    model, messages, max_tokens: maxTokens, temperature: 0, stream: true, ignore_eos: true,
  });
  let n = 0;
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'chat.completion.chunk');
    if (++n === 2) {
      stream.controller.abort();
      break;
    }
  }
  // The server notices the closed connection and counts it (oscar_client_disconnects_total).
  const deadline = Date.now() + 5000;
  let disconnects = 0;
  while (Date.now() < deadline) {
    const text = await (await fetch(`${baseURL}/metrics`)).text();
    const m = text.match(/^oscar_client_disconnects_total (\S+)$/m);
    disconnects = m ? Number(m[1]) : 0;
    if (disconnects >= 1) break;
    await new Promise((r) => setTimeout(r, 50));
  }
  assert.ok(disconnects >= 1, 'server did not see the disconnect');
  const r = await client.chat.completions.create({ model, messages, max_tokens: 2 });
  assert.equal(r.choices.length, 1);
});

// Structured outputs (response_format json_schema, text.format on /v1/responses): the output is
// constrained to the schema, so even the tiny model's answer parses and validates. The schema is
// the math-reasoning example of OpenAI's structured outputs guide; the check below is written
// for it (no validator package is installed here).
const mathSchema = {
  type: 'object',
  properties: {
    steps: {
      type: 'array',
      items: {
        type: 'object',
        properties: { explanation: { type: 'string' }, output: { type: 'string' } },
        required: ['explanation', 'output'],
        additionalProperties: false,
      },
    },
    final_answer: { type: 'string' },
  },
  required: ['steps', 'final_answer'],
  additionalProperties: false,
};

function checkMath(text) {
  const v = JSON.parse(text);
  assert.deepEqual(Object.keys(v), ['steps', 'final_answer']);
  assert.ok(Array.isArray(v.steps));
  for (const s of v.steps) {
    assert.deepEqual(Object.keys(s), ['explanation', 'output']);
    assert.equal(typeof s.explanation, 'string');
    assert.equal(typeof s.output, 'string');
  }
  assert.equal(typeof v.final_answer, 'string');
}

test('response_format json_schema: chat (whole and streamed) and completions validate', async () => {
  const response_format = { type: 'json_schema', json_schema: { name: 'math_reasoning', schema: mathSchema, strict: true } };
  const math = [{ role: 'user', content: 'Solve 8x + 7 = -23.' }];
  const r = await client.chat.completions.create({ model, messages: math, max_tokens: 120, temperature: 0, response_format });
  assert.equal(r.choices[0].finish_reason, 'stop');
  checkMath(r.choices[0].message.content);
  let streamed = '';
  const stream = await client.chat.completions.create({ model, messages: math, max_tokens: 120, temperature: 0, response_format, stream: true });
  for await (const chunk of stream) streamed += chunk.choices[0]?.delta?.content ?? '';
  assert.equal(streamed, r.choices[0].message.content);
  const c = await client.completions.create({ model, prompt: 'JSON:', max_tokens: 80, temperature: 0.8, seed: 3, response_format });
  checkMath(c.choices[0].text);
});

test('responses: text.format json_schema and json_object', async () => {
  const r = await client.responses.create({
    model, input: 'Solve 8x + 7 = -23.', max_output_tokens: 120, temperature: 0,
    text: { format: { type: 'json_schema', name: 'math_reasoning', schema: mathSchema, strict: true } },
  });
  assert.equal(r.status, 'completed');
  checkMath(r.output_text);
  assert.equal(r.text.format.type, 'json_schema');
  const o = await client.responses.create({ model, input: 'JSON please', max_output_tokens: 40, text: { format: { type: 'json_object' } } });
  assert.equal(typeof JSON.parse(o.output_text), 'object');
});

test('error: a schema keyword outside the supported subset is 400 naming it', async () => {
  const schema = { type: 'object', properties: { email: { type: 'string', format: 'email', pattern: '(?<=@)example' } }, required: ['email'], additionalProperties: false };
  await expectApiError(
    client.chat.completions.create({ model, messages, max_tokens: 8, response_format: { type: 'json_schema', json_schema: { name: 'x', schema, strict: true } } }),
    400,
    (err) => {
      assert.equal(err.param, 'response_format.json_schema.schema');
      assert.match(err.error.message, /'pattern' \(at #\/properties\/email\): lookbehind '\(\?<=' is not supported/);
    },
  );
});
