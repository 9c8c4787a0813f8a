// End-to-end: `kiln serve` on the bundled kiln-tiny (models/kiln-tiny.gguf) driven by the
// official `@anthropic-ai/sdk` client through /v1/messages and /v1/messages/count_tokens:
// whole and streamed messages (the SDK's stream helper parses every event), a dictionary
// tool round trip, each stop reason kiln-tiny can be made to reach, count_tokens against
// usage, auth by x-api-key and by Bearer, Anthropic's error envelope, a replay of a
// Claude Code-shaped request (tests/fixtures/anthropic/claude_code_request.json), and the
// prefix cache across two turns whose system prompts differ only in the billing header.
//   node --test tests/e2e/anthropic_test.mjs   (KILN_BIN set by CTest)
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import Anthropic from '@anthropic-ai/sdk';
import { startKiln, stopKiln } from './lib/kiln_server.mjs';
import { DICTIONARY_TOOL, RIVER } from './lib/kiln_tiny.mjs';

const API_KEY = 'kiln-anthropic-key';
const REPLAY = JSON.parse(
  fs.readFileSync(new URL('../fixtures/anthropic/claude_code_request.json', import.meta.url)));
const DICTIONARY = {
  name: DICTIONARY_TOOL.name,
  description: DICTIONARY_TOOL.description,
  input_schema: DICTIONARY_TOOL.parameters,
};

let server;
let base;
let client;  // x-api-key
let bearer;  // Authorization: Bearer

before(async () => {
  const started = await startKiln(['-t', '2', '--ctx', '4096', '--max-seqs', '4', '--api-key', API_KEY]);
  server = started.server;
  base = started.base;
  client = new Anthropic({ baseURL: base, apiKey: API_KEY, maxRetries: 0 });
  bearer = new Anthropic({ baseURL: base, apiKey: null, authToken: API_KEY, maxRetries: 0 });
});

after(async () => {
  await stopKiln(server);
});

const ask = (word, extra = {}) => ({
  model: 'claude-sonnet-4-5', max_tokens: 48, temperature: 0,
  messages: [{ role: 'user', content: `What does ${word} mean?` }], ...extra,
});

test('a whole message: text block, end_turn, usage equal to count_tokens', async () => {
  const m = await client.messages.create(ask('river'));
  assert.equal(m.type, 'message');
  assert.equal(m.role, 'assistant');
  assert.match(m.id, /^msg_/);
  assert.equal(m.content.length, 1);
  assert.equal(m.content[0].type, 'text');
  assert.match(m.content[0].text.toLowerCase(), /^river/);
  assert.equal(m.stop_reason, 'end_turn', JSON.stringify(m));
  assert.equal(m.stop_sequence, null);
  assert.ok(m.usage.output_tokens > 0);
  const { model, max_tokens, temperature, ...countable } = ask('river');
  const count = await client.messages.countTokens({ model, ...countable });
  assert.equal(count.input_tokens, m.usage.input_tokens + m.usage.cache_read_input_tokens);
  // A prompt never seen before has nothing cached: the counts are equal outright.
  const fresh = ask('apple', { system: `Session ${Date.now()}` });
  const m2 = await client.messages.create(fresh);
  assert.equal(m2.usage.cache_read_input_tokens, 0);
  const c2 = await client.messages.countTokens({ model, system: fresh.system, messages: fresh.messages });
  assert.equal(c2.input_tokens, m2.usage.input_tokens);
});

test('a streamed message accumulates to the whole one (SDK stream helper)', async () => {
  const whole = await client.messages.create(ask('dog'));
  const stream = client.messages.stream(ask('dog'));
  const seen = [];
  stream.on('streamEvent', (e) => seen.push(e.type));
  const streamed = await stream.finalMessage();
  assert.deepEqual(streamed.content, whole.content);
  assert.equal(streamed.stop_reason, whole.stop_reason);
  assert.equal(streamed.usage.output_tokens, whole.usage.output_tokens);
  assert.equal(seen[0], 'message_start');
  assert.equal(seen.at(-1), 'message_stop');
  assert.ok(seen.includes('content_block_start') && seen.includes('content_block_delta'));
  assert.equal(seen.at(-2), 'message_delta');
});

test('stop reasons: max_tokens and stop_sequence', async () => {
  const short = await client.messages.create(ask('water', { max_tokens: 2 }));
  assert.equal(short.stop_reason, 'max_tokens');
  assert.equal(short.usage.output_tokens, 2);
  const stopped = await client.messages.create(ask('water', { stop_sequences: ['compound'] }));
  assert.equal(stopped.stop_reason, 'stop_sequence', JSON.stringify(stopped));
  assert.equal(stopped.stop_sequence, 'compound');
  assert.ok(!stopped.content[0].text.includes('compound'));
});

test('tool round trip with the dictionary tool: tool_use -> tool_result -> answer', async () => {
  const messages = [{ role: 'user', content: 'What does river mean?' }];
  const m = await client.messages.create({
    model: 'kiln', max_tokens: 48, temperature: 0, tools: [DICTIONARY], messages,
  });
  assert.equal(m.stop_reason, 'tool_use', JSON.stringify(m));
  const use = m.content.find((b) => b.type === 'tool_use');
  assert.equal(use.name, 'dictionary');
  assert.deepEqual(use.input, { word: 'river' });
  messages.push({ role: 'assistant', content: m.content });
  messages.push({ role: 'user', content: [{
    type: 'tool_result', tool_use_id: use.id,
    content: [{ type: 'text', text: RIVER }],
  }] });
  const answer = await client.messages.create({
    model: 'kiln', max_tokens: 48, temperature: 0, tools: [DICTIONARY], messages,
  });
  assert.equal(answer.stop_reason, 'end_turn');
  assert.match(answer.content[0].text, /stream of water/);

  // Streamed, the call arrives as input_json_delta and the SDK parses it.
  const streamed = await client.messages.stream({
    model: 'kiln', max_tokens: 48, temperature: 0, tools: [DICTIONARY], messages: messages.slice(0, 1),
  }).finalMessage();
  assert.equal(streamed.stop_reason, 'tool_use');
  assert.deepEqual(streamed.content.find((b) => b.type === 'tool_use').input, { word: 'river' });
});

const GET_WEATHER = {
  name: 'get_weather',
  description: 'Get the current weather in a city.',
  input_schema: {
    type: 'object',
    properties: { city: { type: 'string', maxLength: 20 }, unit: { enum: ['celsius', 'fahrenheit'] } },
    required: ['city'],
    additionalProperties: false,
  },
};

// kiln-tiny, trained to call `dictionary`, is forced by tool_choice through the grammar:
// `tool` names the call, `any` allows only an offered tool, and the block always parses.
test('tool_choice tool and any force a parsable tool_use of an offered tool', async () => {
  const check = (m, name) => {
    assert.equal(m.stop_reason, 'tool_use', JSON.stringify(m));
    const uses = m.content.filter((b) => b.type === 'tool_use');
    assert.equal(uses.length, 1, JSON.stringify(m));
    assert.equal(uses[0].name, name);
    return uses[0].input;
  };
  for (let i = 0; i < 2; ++i) {  // sampled (Messages has no seed): any sample must conform
    const m = await client.messages.create({
      model: 'kiln', max_tokens: 120, temperature: 1,
      messages: [{ role: 'user', content: 'What does river mean?' }],
      tools: [DICTIONARY, GET_WEATHER],
      tool_choice: { type: 'tool', name: 'get_weather', disable_parallel_tool_use: true },
    });
    const input = check(m, 'get_weather');
    assert.equal(typeof input.city, 'string');
    assert.ok([...input.city].length <= 20);
    if ('unit' in input) assert.ok(['celsius', 'fahrenheit'].includes(input.unit));
    assert.deepEqual(Object.keys(input).filter((k) => !['city', 'unit'].includes(k)), []);
  }
  // any with only get_weather offered: the trained dictionary call cannot happen.
  const streamed = await client.messages.stream({
    model: 'kiln', max_tokens: 120, temperature: 0,
    messages: [{ role: 'user', content: 'What does dog mean?' }],
    tools: [GET_WEATHER], tool_choice: { type: 'any', disable_parallel_tool_use: true },
  }).finalMessage();
  assert.equal(typeof check(streamed, 'get_weather').city, 'string');
  await assert.rejects(client.messages.create({
    model: 'kiln', max_tokens: 8, messages: [{ role: 'user', content: 'hi' }],
    tools: [GET_WEATHER], tool_choice: { type: 'tool', name: 'get_stock' },
  }), (e) => e.status === 400 && e.error?.error?.type === 'invalid_request_error' &&
    /tool_choice\.name/.test(e.message));
});

test('auth: x-api-key and Bearer both work, a wrong key is authentication_error', async () => {
  assert.equal((await bearer.messages.create(ask('winter', { max_tokens: 4 }))).type, 'message');
  const wrong = new Anthropic({ baseURL: base, apiKey: 'nope', maxRetries: 0 });
  await assert.rejects(wrong.messages.create(ask('winter', { max_tokens: 4 })), (e) => {
    assert.equal(e.status, 401);
    assert.equal(e.error.type, 'error');
    assert.equal(e.error.error.type, 'authentication_error');
    return true;
  });
});

test('errors come in Anthropic\'s envelope', async () => {
  const r = await fetch(`${base}/v1/messages`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-api-key': API_KEY },
    body: JSON.stringify({ model: 'kiln', messages: [{ role: 'user', content: 'hi' }] }),
  });
  assert.equal(r.status, 400);
  const body = await r.json();
  assert.equal(body.type, 'error');
  assert.equal(body.error.type, 'invalid_request_error');
  assert.match(body.error.message, /max_tokens/);
  await assert.rejects(client.messages.create({
    model: 'kiln', max_tokens: 8, messages: [{ role: 'user', content: [
      { type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'iVBORw0KGgo=' } }] }],
  }), (e) => {
    assert.equal(e.status, 400);
    assert.match(e.error.error.message, /messages\[0\]\.content\[0\].*image/);
    return true;
  });
});

// Parses an SSE body into [{event, data}] and checks the Messages stream grammar.
function checkStream(text) {
  const events = text.split('\n\n').filter((s) => s.length > 0).map((chunk) => {
    const lines = chunk.split('\n');
    assert.match(lines[0], /^event: /, chunk);
    assert.match(lines[1], /^data: /, chunk);
    const data = JSON.parse(lines[1].slice(6));
    assert.equal(data.type, lines[0].slice(7));
    return data;
  });
  const types = events.map((e) => e.type).filter((t) => t !== 'ping');
  assert.equal(types[0], 'message_start');
  assert.deepEqual(types.slice(-2), ['message_delta', 'message_stop']);
  let open = -1;
  let next = 0;
  for (const e of events) {
    if (e.type === 'content_block_start') {
      assert.equal(open, -1, 'a block starts while another is open');
      assert.equal(e.index, next++);
      open = e.index;
    } else if (e.type === 'content_block_delta') {
      assert.equal(e.index, open);
    } else if (e.type === 'content_block_stop') {
      assert.equal(e.index, open);
      open = -1;
    }
  }
  assert.equal(open, -1);
  return events;
}

test('a Claude Code-shaped request replays: 200 and a well-formed stream', async () => {
  assert.ok(REPLAY.tools.length >= 15);
  const r = await fetch(`${base}/v1/messages?beta=true`, {
    method: 'POST',
    headers: {
      'content-type': 'application/json', 'x-api-key': API_KEY, 'anthropic-version': '2023-06-01',
      'anthropic-beta': 'claude-code-20250219,interleaved-thinking-2025-05-14,fine-grained-tool-streaming-2025-05-14',
      'x-app': 'cli', 'user-agent': 'claude-cli/2.0.0 (external, cli)',
    },
    body: JSON.stringify(REPLAY),
  });
  const text = await r.text();
  assert.equal(r.status, 200, text);
  assert.match(r.headers.get('content-type'), /text\/event-stream/);
  const events = checkStream(text);
  const delta = events.find((e) => e.type === 'message_delta');
  assert.ok(['end_turn', 'max_tokens', 'tool_use'].includes(delta.delta.stop_reason));
  // The same body counts without max_tokens or stream.
  const { max_tokens, stream, ...countable } = REPLAY;
  const count = await client.messages.countTokens(countable);
  assert.equal(count.input_tokens,
               delta.usage.input_tokens + delta.usage.cache_read_input_tokens);
});

test('the billing header line does not defeat the prefix cache across turns', async () => {
  const system = (cch) => [
    { type: 'text', text: `x-anthropic-billing-header: cc_version=2.0.14.a1b; cc_entrypoint=cli; cch=${cch};` },
    { type: 'text', text: 'You are a dictionary assistant. Answer with the meaning of the word the user asks about, in one sentence, as a dictionary would.',
      cache_control: { type: 'ephemeral' } },
  ];
  const turn1 = { model: 'kiln', max_tokens: 16, temperature: 0, system: system('4f1c2'),
                  messages: [{ role: 'user', content: 'What does winter mean?' }] };
  const m1 = await client.messages.create(turn1);
  const p1 = m1.usage.input_tokens + m1.usage.cache_read_input_tokens;
  assert.ok(p1 >= 32, `turn 1 prompt has ${p1} tokens`);
  const turn2 = { ...turn1, system: system('9e0d7'), messages: [
    ...turn1.messages, { role: 'assistant', content: m1.content },
    { role: 'user', content: 'And what does apple mean?' }] };
  const m2 = await client.messages.create(turn2);
  // The cache holds whole 16-token blocks: every full block of turn 1's prompt is reused.
  assert.ok(m2.usage.cache_read_input_tokens >= Math.floor(p1 / 16) * 16,
            `turn 2 read ${m2.usage.cache_read_input_tokens} cached tokens; turn 1's prompt had ${p1}`);
});
