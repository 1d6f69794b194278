// The clients the project's own tests never used, against an oscar server: the Vercel AI SDK
// (@ai-sdk/openai-compatible) and LangChain (@langchain/openai), versions pinned in package.json.
// Checked: content parts, developer/system messages, requests without max_tokens, streaming,
// tool_choice none/required/named against the real model (constrained decoding), and
// (OSCAR_SCRIPTED=1, against `oscar_fake_server --echo-last-content`, whose "model" says exactly
// the last message's content) whole tool loops: the server returns tool_calls, the client runs
// the tool and sends the result back, the server answers with text.
//
// Environment: OSCAR_SERVER_URL (required), OSCAR_API_KEY, OSCAR_SCRIPTED. run.sh sets the first two.
import { test, before } from 'node:test';
import assert from 'node:assert/strict';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { generateText, generateObject, streamText, tool, isStepCount, Output } from 'ai';
import { ChatOpenAI } from '@langchain/openai';
import { HumanMessage, SystemMessage, ToolMessage } from '@langchain/core/messages';
import { z } from 'zod';
import { webcrypto } from 'node:crypto';

// Node 18 (Debian 12's nodejs) has no global `crypto` (Node 19 made it one); LangChain's run ids
// (langsmith's uuid7) call crypto.getRandomValues, so withStructuredOutput failed there with
// "crypto is not defined" (scripts/fresh-machine-check.sh, 2026-12-03).
if (!globalThis.crypto) globalThis.crypto = webcrypto;

const baseURL = process.env.OSCAR_SERVER_URL;
if (!baseURL) throw new Error('set OSCAR_SERVER_URL');
const apiKey = process.env.OSCAR_API_KEY || 'unused';
const scripted = process.env.OSCAR_SCRIPTED === '1';

let modelId;
let sdk;
let chat;

before(async () => {
  const res = await fetch(`${baseURL}/v1/models`, { headers: { Authorization: `Bearer ${apiKey}` } });
  assert.equal(res.status, 200);
  modelId = (await res.json()).data[0].id;
  const provider = createOpenAICompatible({ name: 'oscar', baseURL: `${baseURL}/v1`, apiKey });
  sdk = provider.chatModel(modelId);
  chat = (opts = {}) =>
    new ChatOpenAI({ model: modelId, apiKey, configuration: { baseURL: `${baseURL}/v1` }, maxRetries: 0, ...opts });
});

// What the scripted model "says" to call the weather tool (Qwen3's hermes format).
const callText =
  '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>';

const weather = {
  description: 'The weather in a city',
  inputSchema: z.object({ city: z.string() }),
};

test('AI SDK: system + user text, without max tokens', async () => {
  const r = await generateText({
    model: sdk,
    system: 'You are terse.',
    messages: [{ role: 'user', content: [{ type: 'text', text: 'Say' }, { type: 'text', text: 'hi.' }] }],
    ...(scripted ? {} : { maxOutputTokens: 8 }),
    temperature: 0,
    maxRetries: 0,
  });
  assert.equal(typeof r.text, 'string');
  assert.ok(r.usage.inputTokens > 0);
  if (scripted) assert.equal(r.text, 'Say\nhi.');  // text parts joined with a newline
});

test('AI SDK: streaming', async () => {
  const r = streamText({
    model: sdk,
    messages: [{ role: 'user', content: 'Count: one two' }],
    maxOutputTokens: 8,
    temperature: 0,
    maxRetries: 0,
  });
  let text = '';
  for await (const delta of r.textStream) text += delta;
  assert.equal(text, await r.text);
});

test('LangChain: content parts and a system message', async () => {
  const m = await chat({ maxTokens: scripted ? undefined : 8, temperature: 0 }).invoke([
    new SystemMessage('Be brief.'),
    new HumanMessage({ content: [{ type: 'text', text: 'Hello' }, { type: 'text', text: 'there' }] }),
  ]);
  assert.equal(typeof m.content, 'string');
  if (scripted) assert.equal(m.content, 'Hello\nthere');
});

test('LangChain: an image part is refused with a 400 naming it', async () => {
  await assert.rejects(
    chat({ maxTokens: 4 }).invoke([
      new HumanMessage({ content: [{ type: 'image_url', image_url: { url: 'data:image/png;base64,AAAA' } }] }),
    ]),
    (err) => {
      assert.equal(err.status, 400);
      assert.match(String(err.message), /text only/);
      return true;
    },
  );
});

test('AI SDK: a tool loop', { skip: !scripted && 'needs OSCAR_SCRIPTED=1' }, async () => {
  const seen = [];
  const r = await generateText({
    model: sdk,
    tools: {
      get_weather: tool({
        ...weather,
        execute: async ({ city }) => {
          seen.push(city);
          return `sunny in ${city}`;
        },
      }),
    },
    messages: [{ role: 'user', content: callText }],
    stopWhen: isStepCount(3),
    maxRetries: 0,
  });
  assert.deepEqual(seen, ['Paris']);
  assert.equal(r.steps.length, 2);
  assert.equal(r.steps[0].finishReason, 'tool-calls');
  assert.equal(r.steps[0].toolCalls[0].toolName, 'get_weather');
  assert.deepEqual(r.steps[0].toolCalls[0].input, { city: 'Paris' });
  assert.match(r.text, /sunny in Paris/);  // the tool result, echoed by the scripted model
});

test('AI SDK: a streamed tool call', { skip: !scripted && 'needs OSCAR_SCRIPTED=1' }, async () => {
  const r = streamText({
    model: sdk,
    tools: { get_weather: tool(weather) },
    messages: [{ role: 'user', content: callText }],
    maxRetries: 0,
  });
  const calls = [];
  for await (const part of r.fullStream) if (part.type === 'tool-call') calls.push(part);
  assert.equal(calls.length, 1);
  assert.equal(calls[0].toolName, 'get_weather');
  assert.deepEqual(calls[0].input, { city: 'Paris' });
  assert.equal(await r.finishReason, 'tool-calls');
});

test('LangChain: a tool loop', { skip: !scripted && 'needs OSCAR_SCRIPTED=1' }, async () => {
  const model = chat().bindTools([
    { type: 'function', function: { name: 'get_weather', description: 'The weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } } },
  ]);
  const first = await model.invoke([new HumanMessage(callText)]);
  assert.equal(first.tool_calls.length, 1);
  assert.equal(first.tool_calls[0].name, 'get_weather');
  assert.deepEqual(first.tool_calls[0].args, { city: 'Paris' });
  const second = await model.invoke([
    new HumanMessage(callText),
    first,
    new ToolMessage({ content: 'rainy in Paris', tool_call_id: first.tool_calls[0].id }),
  ]);
  assert.equal(second.tool_calls.length, 0);
  assert.equal(second.content, 'rainy in Paris');
  // Streamed: the chunks add up to the same call.
  let acc;
  for await (const c of await model.stream([new HumanMessage(callText)])) acc = acc ? acc.concat(c) : c;
  assert.equal(acc.tool_calls[0].name, 'get_weather');
  assert.deepEqual(acc.tool_calls[0].args, { city: 'Paris' });
});

// tool_choice against the real model (not OSCAR_SCRIPTED): "required" and a named tool constrain
// decoding (src/engine/tool_constraint.h), so even the tiny model answers with one well-formed
// call to a declared tool, which each client must see as a tool call with finish reason
// tool-calls. The constraint covers the call's form and the name, not the arguments' schema:
// the tiny model, left to choose, closes the object at once (`{}`), so the tools' schemas here
// require nothing and the tests check that what came back parses and satisfies them.
const real = { skip: scripted && 'needs the real model (OSCAR_SCRIPTED=1 runs the scripted one)' };
const citySchema = z.object({ city: z.string().optional() });
const realTools = {
  get_weather: tool({ description: 'The weather in a city', inputSchema: citySchema }),
  get_time: tool({ description: 'The local time in a city', inputSchema: citySchema }),
};
const ask = [{ role: 'user', content: 'What is the weather in Paris?' }];
// The shortest whole call to get_weather is 27 tokens with the tiny model's tokenizer:
// `<tool_call>\n{"name": "get_weather", "arguments": ` (20), `{}` (1), `}\n</tool_call>` (6).
// The constraint closes the arguments in time for any budget at least that, so a few more leave
// the model some choice and still end in a whole call; fewer cut it (the last test).
const callBudget = 32;

// What the AI SDK made of a constrained step: one valid call to a declared tool.
function checkSdkCall(r, names) {
  assert.equal(r.finishReason, 'tool-calls');
  assert.equal(r.toolCalls.length, 1);
  const [call] = r.toolCalls;
  assert.ok(names.includes(call.toolName), call.toolName);
  assert.ok(!call.invalid, `the SDK refused the call's input: ${call.error}`);
  assert.deepEqual(citySchema.parse(call.input), call.input);
  assert.ok(r.usage.outputTokens <= callBudget);
}

test('AI SDK: toolChoice required', real, async () => {
  const r = await generateText({
    model: sdk, tools: realTools, toolChoice: 'required', messages: ask,
    maxOutputTokens: callBudget, temperature: 0, maxRetries: 0,
  });
  checkSdkCall(r, ['get_weather', 'get_time']);
});

test('AI SDK: toolChoice naming a tool', real, async () => {
  // get_time, not the tool the question is about: the name comes from the choice, not the model.
  const r = await generateText({
    model: sdk, tools: realTools, toolChoice: { type: 'tool', toolName: 'get_time' }, messages: ask,
    maxOutputTokens: callBudget, temperature: 0, maxRetries: 0,
  });
  checkSdkCall(r, ['get_time']);
});

test('AI SDK: streamed, toolChoice naming a tool', real, async () => {
  const r = streamText({
    model: sdk, tools: realTools, toolChoice: { type: 'tool', toolName: 'get_weather' }, messages: ask,
    maxOutputTokens: callBudget, temperature: 0, maxRetries: 0,
  });
  const calls = [];
  let text = '';
  for await (const part of r.fullStream) {
    if (part.type === 'tool-call') calls.push(part);
    if (part.type === 'text-delta') text += part.text;
    if (part.type === 'error') throw part.error;
  }
  assert.equal(text, '');  // the call's markup is not streamed as text
  assert.equal(calls.length, 1);
  assert.equal(calls[0].toolName, 'get_weather');
  assert.ok(!calls[0].invalid);
  assert.deepEqual(citySchema.parse(calls[0].input), calls[0].input);
  assert.equal(await r.finishReason, 'tool-calls');
});

test('AI SDK: toolChoice none gets text and no tool call', real, async () => {
  const r = await generateText({
    model: sdk, tools: realTools, toolChoice: 'none', messages: ask,
    maxOutputTokens: 8, temperature: 0, maxRetries: 0,
  });
  assert.equal(r.toolCalls.length, 0);
  assert.ok(r.text.length > 0);
  assert.notEqual(r.finishReason, 'tool-calls');
});

// LangChain's bindTools sends tool_choice as OpenAI does: "required", and a tool's name as
// {"type": "function", "function": {"name": ...}} (@langchain/openai's formatToOpenAIToolChoice).
const lcTools = ['get_weather', 'get_time'].map((name) => ({
  type: 'function',
  function: { name, description: `${name} for a city`, parameters: { type: 'object', properties: { city: { type: 'string' } } } },
}));

for (const [label, choice, names] of [
  ['required', 'required', ['get_weather', 'get_time']],
  ['a tool name', 'get_time', ['get_time']],
  ['the object form', { type: 'function', function: { name: 'get_weather' } }, ['get_weather']],
]) {
  test(`LangChain: bindTools with tool_choice ${label}`, real, async () => {
    const m = await chat({ maxTokens: callBudget, temperature: 0 })
      .bindTools(lcTools, { tool_choice: choice })
      .invoke([new HumanMessage('What is the weather in Paris?')]);
    assert.equal(m.tool_calls.length, 1);
    assert.deepEqual(m.invalid_tool_calls, []);
    assert.ok(names.includes(m.tool_calls[0].name), m.tool_calls[0].name);
    assert.equal(typeof m.tool_calls[0].args, 'object');
    assert.deepEqual(citySchema.parse(m.tool_calls[0].args), m.tool_calls[0].args);
    assert.equal(m.response_metadata.finish_reason, 'tool_calls');
  });
}

test('LangChain: tool_choice none gets text', real, async () => {
  const m = await chat({ maxTokens: 8, temperature: 0 })
    .bindTools(lcTools, { tool_choice: 'none' })
    .invoke([new HumanMessage('What is the weather in Paris?')]);
  assert.equal(m.tool_calls.length, 0);
  assert.equal(typeof m.content, 'string');
  assert.ok(m.content.length > 0);
});

test('a budget too small for the whole call is cut by length, not failed', real, async () => {
  // 24 tokens hold the name but not `{}` and the end: the server once failed such a request
  // with a 500 (its mask allowed no token); now the call is cut (finish_reason "length") and
  // left as text, as OpenAI leaves a call cut by max_tokens.
  const m = await chat({ maxTokens: 24, temperature: 0 })
    .bindTools(lcTools, { tool_choice: 'get_weather' })
    .invoke([new HumanMessage('What is the weather in Paris?')]);
  assert.equal(m.response_metadata.finish_reason, 'length');
  assert.equal(m.tool_calls.length, 0);
  assert.match(m.content, /^<tool_call>\n\{"name": "get_weather", "arguments": /);
  // The AI SDK checks a named toolChoice itself: no call is its own error, not the server's.
  await assert.rejects(
    generateText({
      model: sdk, tools: realTools, toolChoice: { type: 'tool', toolName: 'get_weather' },
      messages: ask, maxOutputTokens: 24, temperature: 0, maxRetries: 0,
    }),
    { name: 'AI_ToolChoiceViolationError' },
  );
});

// Structured outputs against the real model: each client's own API with a zod schema. LangChain's
// withStructuredOutput defaults to response_format json_schema (method "jsonSchema"); the AI SDK's
// openai-compatible provider sends json_schema when created with supportsStructuredOutputs (else
// json_object, which would not hold the tiny model to the schema). The server constrains decoding
// to the schema, so what comes back validates.
const Person = z.object({
  name: z.string().max(40),
  age: z.number().int().min(0).max(120),
  kind: z.enum(['capital', 'town', 'village']),
  tags: z.array(z.string().max(20)).max(2),
  note: z.string().max(40).nullable(),
  address: z.object({ city: z.string().max(30), zip: z.string().max(10).optional() }),
});

test('LangChain: withStructuredOutput(zod) with its defaults', real, async () => {
  const structured = chat({ maxTokens: 250, temperature: 0 }).withStructuredOutput(Person);
  const r = await structured.invoke([new HumanMessage('Describe Paris as a person record.')]);
  assert.deepEqual(Person.parse(r), r);
  // Sampled too, and with the raw message.
  const raw = await chat({ maxTokens: 250, temperature: 1 }).withStructuredOutput(Person, { includeRaw: true, name: 'person' })
    .invoke([new HumanMessage('Describe Lyon.')]);
  assert.deepEqual(Person.parse(raw.parsed), raw.parsed);
  assert.equal(raw.raw.response_metadata.finish_reason, 'stop');
});

test('LangChain: withStructuredOutput with an unsupported zod check is a 400 naming it', real, async () => {
  await assert.rejects(
    chat({ maxTokens: 20 }).withStructuredOutput(z.object({ count: z.number().multipleOf(5) })).invoke([new HumanMessage('x')]),
    (err) => {
      assert.equal(err.status, 400);
      assert.match(String(err.message), /'multipleOf' \(at #\/properties\/count\) is not supported/);
      return true;
    },
  );
});

test('AI SDK: generateObject with a zod schema', real, async () => {
  const provider = createOpenAICompatible({ name: 'oscar', baseURL: `${baseURL}/v1`, apiKey, supportsStructuredOutputs: true });
  for (const temperature of [0, 1]) {
    const r = await generateObject({
      model: provider.chatModel(modelId), schema: Person, schemaName: 'person',
      prompt: 'Describe Paris as a person record.', maxOutputTokens: 250, temperature, maxRetries: 0,
    });
    assert.deepEqual(Person.parse(r.object), r.object);
    assert.equal(r.finishReason, 'stop');
  }
  // generateObject's successor in AI SDK 7: generateText with an output setting.
  const t = await generateText({
    model: provider.chatModel(modelId), output: Output.object({ schema: Person }),
    prompt: 'Describe Lyon.', maxOutputTokens: 250, temperature: 0, maxRetries: 0,
  });
  assert.deepEqual(Person.parse(t.output), t.output);
});
