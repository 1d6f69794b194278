// The clients the project's own tests never used, against an oscar server: the Vercel AI SDK
// (@ai-sdk/openai-compatible) and LangChain (@langchain/openai), versions pinned in package.json.
// Checked: content parts, developer/system messages, requests without max_tokens, streaming, and
// (OSCAR_SCRIPTED=1, against `oscar_fake_server --echo-last-content`, whose "model" says exactly
// the last message's content) whole tool loops: the server returns tool_calls, the client runs
// the tool and sends the result back, the server answers with text.
//
// Environment: OSCAR_SERVER_URL (required), OSCAR_API_KEY, OSCAR_SCRIPTED. run.sh sets the first two.
import { test, before } from 'node:test';
import assert from 'node:assert/strict';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { generateText, streamText, tool, isStepCount } from 'ai';
import { ChatOpenAI } from '@langchain/openai';
import { HumanMessage, SystemMessage, ToolMessage } from '@langchain/core/messages';
import { z } from 'zod';

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
