// End-to-end: `kiln serve` on the bundled kiln-tiny (models/kiln-tiny.gguf) driven by the
// official `openai` client through /v1/responses: a whole response, a streamed one (the SDK's
// stream helper accumulates every event; its final response equals the whole one), a
// dictionary function-call round trip both by previous_response_id and by sending the items
// back, the previous_response_not_found miss, retrieve and delete, max_output_tokens, hosted
// and custom tools accepted, the error envelope, and /v1/responses/compact (the SDK's
// responses.compact, its output sent back as the next turn's input).
//   node --test tests/e2e/responses_test.mjs   (KILN_BIN set by CTest)
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startKiln, stopKiln } from './lib/kiln_server.mjs';
import { DICTIONARY_TOOL, RIVER } from './lib/kiln_tiny.mjs';

const DICTIONARY = { type: 'function', ...DICTIONARY_TOOL, strict: false };

let server;
let client;

before(async () => {
  const started = await startKiln(['-t', '2', '--ctx', '2048', '--max-seqs', '4']);
  server = started.server;
  const base = started.base;
  client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0 });
});

after(async () => {
  await stopKiln(server);
});

const ask = (word, extra = {}) => ({
  model: 'kiln', temperature: 0, max_output_tokens: 96,
  input: `What does ${word} mean?`, ...extra,
});

test('a whole response: one message, completed, usage', async () => {
  const r = await client.responses.create(ask('river'));
  assert.equal(r.object, 'response');
  assert.match(r.id, /^resp_/);
  assert.equal(r.status, 'completed', JSON.stringify(r));
  assert.equal(r.error, null);
  assert.equal(r.incomplete_details, null);
  assert.equal(r.output.length, 1);
  const m = r.output[0];
  assert.equal(m.type, 'message');
  assert.equal(m.role, 'assistant');
  assert.equal(m.status, 'completed');
  assert.equal(m.content[0].type, 'output_text');
  assert.deepEqual(m.content[0].annotations, []);
  assert.match(r.output_text.toLowerCase(), /^river/);  // the SDK's convenience field
  assert.ok(r.usage.input_tokens > 0);
  assert.ok(r.usage.output_tokens > 0);
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
  assert.equal(typeof r.usage.input_tokens_details.cached_tokens, 'number');
  assert.equal(r.usage.output_tokens_details.reasoning_tokens, 0);  // kiln-tiny does not think
});

test('a streamed response accumulates to the whole one (SDK stream helper)', async () => {
  const whole = await client.responses.create(ask('dog'));
  const stream = client.responses.stream(ask('dog'));
  const seen = [];
  stream.on('event', (e) => seen.push(e));
  const streamed = await stream.finalResponse();
  assert.equal(streamed.output_text, whole.output_text);
  assert.equal(streamed.status, 'completed');
  assert.deepEqual(streamed.usage.output_tokens, whole.usage.output_tokens);
  const types = seen.map((e) => e.type);
  assert.deepEqual(types.slice(0, 4), ['response.created', 'response.in_progress',
                                       'response.output_item.added', 'response.content_part.added']);
  assert.deepEqual(types.slice(-4), ['response.output_text.done', 'response.content_part.done',
                                     'response.output_item.done', 'response.completed']);
  assert.ok(types.includes('response.output_text.delta'));
  seen.forEach((e, i) => assert.equal(e.sequence_number, i));
  const deltas = seen.filter((e) => e.type === 'response.output_text.delta').map((e) => e.delta);
  assert.equal(deltas.join(''), whole.output_text);
  // Streamed responses are stored as well (the stream helper adds `parsed` to its parts).
  const stored = await client.responses.retrieve(streamed.id);
  assert.equal(stored.output_text, streamed.output_text);
  assert.deepEqual(stored.output.map((o) => o.id), streamed.output.map((o) => o.id));
  assert.deepEqual(stored.usage, streamed.usage);
});

test('function call round trip by previous_response_id, and by sending the items back', async () => {
  const first = await client.responses.create({
    model: 'kiln', temperature: 0, max_output_tokens: 32, tools: [DICTIONARY],
    input: 'What does river mean?',
  });
  const call = first.output.find((o) => o.type === 'function_call');
  assert.ok(call, JSON.stringify(first.output));
  assert.equal(call.name, 'dictionary');
  assert.equal(call.status, 'completed');
  assert.match(call.call_id, /^call_/);
  assert.deepEqual(JSON.parse(call.arguments), { word: 'river' });

  const answer = await client.responses.create({
    model: 'kiln', temperature: 0, max_output_tokens: 32, tools: [DICTIONARY],
    previous_response_id: first.id,
    input: [{ type: 'function_call_output', call_id: call.call_id, output: RIVER }],
  });
  assert.equal(answer.previous_response_id, first.id);
  assert.equal(answer.status, 'completed');
  assert.match(answer.output_text, /stream of water/, answer.output_text);

  // Stateless (store: false, as Codex runs): the client sends the whole conversation.
  const stateless = await client.responses.create({
    model: 'kiln', temperature: 0, max_output_tokens: 32, tools: [DICTIONARY], store: false,
    input: [
      { role: 'user', content: 'What does river mean?' },
      ...first.output,
      { type: 'function_call_output', call_id: call.call_id, output: RIVER },
    ],
  });
  assert.equal(stateless.output_text, answer.output_text);
  await assert.rejects(client.responses.retrieve(stateless.id), (e) => e.status === 404);

  // Streamed, the call arrives as function_call_arguments events.
  const stream = client.responses.stream({
    model: 'kiln', temperature: 0, max_output_tokens: 32, tools: [DICTIONARY],
    input: 'What does river mean?',
  });
  const types = [];
  stream.on('event', (e) => types.push(e.type));
  const streamed = await stream.finalResponse();
  assert.ok(types.includes('response.function_call_arguments.delta'), types.join(' '));
  assert.ok(types.includes('response.function_call_arguments.done'), types.join(' '));
  const streamedCall = streamed.output.find((o) => o.type === 'function_call');
  assert.deepEqual(JSON.parse(streamedCall.arguments), { word: 'river' });
});

test('previous_response_id: a miss is 404 previous_response_not_found', async () => {
  await assert.rejects(
    client.responses.create({ ...ask('river'), previous_response_id: 'resp_never_was' }), (e) => {
      assert.equal(e.status, 404);
      assert.equal(e.code, 'previous_response_not_found');
      assert.equal(e.param, 'previous_response_id');
      return true;
    });
});

test('retrieve and delete a stored response', async () => {
  const r = await client.responses.create(ask('apple'));
  const got = await client.responses.retrieve(r.id);
  assert.equal(got.id, r.id);
  assert.deepEqual(got.output, r.output);
  await client.responses.delete(r.id);
  await assert.rejects(client.responses.retrieve(r.id), (e) => e.status === 404);
  await assert.rejects(
    client.responses.create({ ...ask('apple'), previous_response_id: r.id }),
    (e) => e.status === 404 && e.code === 'previous_response_not_found');
});

test('max_output_tokens cuts the response: status incomplete', async () => {
  const r = await client.responses.create(ask('water', { max_output_tokens: 2 }));
  assert.equal(r.status, 'incomplete');
  assert.deepEqual(r.incomplete_details, { reason: 'max_output_tokens' });
  assert.equal(r.usage.output_tokens, 2);
  assert.equal(r.max_output_tokens, 2);
});

test('hosted tools are left out with a warning, custom tools accepted, never a 400', async () => {
  const r = await client.responses.create({
    ...ask('winter'),
    tools: [{ type: 'web_search' }, { type: 'file_search', vector_store_ids: ['vs_1'] },
            { type: 'custom', name: 'apply_patch', description: 'Apply a patch to files.' },
            { type: 'local_shell' }],
    reasoning: { effort: 'low' }, text: { verbosity: 'low' }, metadata: { run: 'e2e' },
    include: ['reasoning.encrypted_content'], prompt_cache_key: 'e2e',
  });
  assert.ok(['completed', 'incomplete'].includes(r.status));
  assert.equal(r.warnings.length, 2, JSON.stringify(r.warnings));
  assert.deepEqual(r.metadata, { run: 'e2e' });
  assert.equal(r.tools.length, 4);
});

test('errors come in OpenAI\'s envelope', async () => {
  await assert.rejects(client.responses.create({
    model: 'kiln', input: [{ role: 'user', content: [
      { type: 'input_text', text: 'What is this?' },
      { type: 'input_image', image_url: 'data:image/png;base64,iVBORw0KGgo=' }] }],
  }), (e) => {
    assert.equal(e.status, 400);
    assert.equal(e.param, 'input[0].content[1]');
    assert.match(e.message, /input_image/);
    return true;
  });
  await assert.rejects(client.responses.create({ model: 'kiln' }),
                       (e) => e.status === 400 && e.param === 'input');
});

test('compact: the conversation becomes its user messages and a compaction item that continues', async () => {
  const first = await client.responses.create(ask('river'));
  const compacted = await client.responses.compact({
    model: 'kiln', previous_response_id: first.id, max_output_tokens: 48,
    input: [{ role: 'user', content: 'What does apple mean?' }],
  });
  assert.equal(compacted.object, 'response.compaction');
  assert.match(compacted.id, /^resp_/);
  assert.ok(Number.isInteger(compacted.created_at));
  assert.deepEqual(compacted.output.map((o) => o.type), ['message', 'message', 'compaction']);
  assert.deepEqual(compacted.output.slice(0, 2).map((o) => [o.role, o.content[0].text]),
                   [['user', 'What does river mean?'], ['user', 'What does apple mean?']]);
  const item = compacted.output[2];
  assert.match(item.id, /^cmp_/);
  assert.ok(item.encrypted_content.length > 0);
  assert.ok(compacted.usage.input_tokens > first.usage.input_tokens);
  assert.ok(compacted.usage.output_tokens > 0 && compacted.usage.output_tokens <= 48);
  assert.equal(compacted.usage.total_tokens, compacted.usage.input_tokens + compacted.usage.output_tokens);
  // The compacted output is the next turn's history (as Codex sends it back).
  const next = await client.responses.create({
    ...ask('water'), input: [...compacted.output, { role: 'user', content: 'What does water mean?' }],
  });
  assert.equal(next.status, 'completed', JSON.stringify(next));
  assert.equal(next.warnings, undefined);
  await assert.rejects(client.responses.compact({ model: 'kiln' }),
                       (e) => e.status === 400 && e.param === 'input');
});
