// End-to-end: a live `kiln serve` on the real stories260K model, driven by the official
// `openai` npm client (and raw fetch for malformed requests).
//   node --test tests/e2e/serve_test.mjs   (KILN_BIN and KILN_SHARED set by CTest)
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import OpenAI from 'openai';

const KILN = process.env.KILN_BIN;
const SHARED = process.env.KILN_SHARED;
const MODEL = `${SHARED}/models/stories260K.gguf`;
const GOLDEN = JSON.parse(fs.readFileSync(`${SHARED}/models/stories260K.greedy64.nodellamacpp.json`));
const API_KEY = 'kiln-test-key';

let server;
let base;
let client;

async function waitHealthy(url, ms) {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    try {
      const r = await fetch(`${url}/health`);
      if (r.status === 200) return;
    } catch {}
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error('server did not become healthy');
}

async function metric(name) {
  const text = await (await fetch(`${base}/metrics`, { headers: { Authorization: `Bearer ${API_KEY}` } })).text();
  const line = text.split('\n').find((l) => l.startsWith(name + ' ') || l.startsWith(name + '{'));
  return line === undefined ? undefined : Number(line.split(' ').pop());
}

before(async () => {
  server = spawn(KILN, ['serve', '-m', MODEL, '--port', '0', '--api-key', API_KEY, '--model-name',
                        'stories', '-t', '2', '--ctx', '256', '--max-seqs', '8'],
                 { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  const port = await new Promise((resolve, reject) => {
    server.stderr.on('data', (d) => {
      log += d.toString();
      const m = log.match(/listening on http:\/\/[^:]+:(\d+)/);
      if (m) resolve(Number(m[1]));
    });
    server.on('exit', (code) => reject(new Error(`kiln serve exited ${code}: ${log}`)));
  });
  base = `http://127.0.0.1:${port}`;
  await waitHealthy(base, 30000);
  client = new OpenAI({ baseURL: `${base}/v1`, apiKey: API_KEY, maxRetries: 0 });
});

after(async () => {
  server.kill('SIGTERM');
  await new Promise((r) => server.on('exit', r));
});

test('completions: greedy text equals llama.cpp', async () => {
  const r = await client.completions.create({
    model: 'stories', prompt: 'Once upon a time', max_tokens: 64, temperature: 0,
  });
  assert.equal(r.object, 'text_completion');
  assert.equal(r.choices[0].text, GOLDEN.text);
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.prompt_tokens, GOLDEN.prompt_ids.length);
  assert.equal(r.usage.completion_tokens, 64);
});

test('completions: stop string and logprobs', async () => {
  const r = await client.completions.create({
    model: 'stories', prompt: 'Once upon a time', max_tokens: 64, temperature: 0, stop: ['Lily'],
    logprobs: 2,
  });
  assert.equal(r.choices[0].text, ', there was a little girl named ');
  assert.equal(r.choices[0].finish_reason, 'stop');
  const lp = r.choices[0].logprobs;
  assert.ok(lp.tokens.length > 0 && lp.tokens.length === lp.token_logprobs.length);
  for (const v of lp.token_logprobs) assert.ok(v <= 0);
});

test('chat: non-stream and stream agree, usage reported', async () => {
  const messages = [{ role: 'user', content: 'Tell me a story.' }];
  const a = await client.chat.completions.create({ model: 'stories', messages, max_tokens: 24, temperature: 0 });
  assert.equal(a.object, 'chat.completion');
  assert.equal(a.choices[0].message.role, 'assistant');
  assert.equal(a.choices[0].finish_reason, 'length');
  assert.equal(a.usage.completion_tokens, 24);
  const stream = await client.chat.completions.create({
    model: 'stories', messages, max_tokens: 24, temperature: 0, stream: true,
    stream_options: { include_usage: true },
  });
  let text = '';
  let usage;
  let finish;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      text += c.delta?.content ?? '';
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.equal(text, a.choices[0].message.content);
  assert.equal(finish, 'length');
  assert.equal(usage.completion_tokens, 24);
  assert.equal(usage.prompt_tokens, a.usage.prompt_tokens);
});

test('chat: tools are accepted and a tool result turn renders', async () => {
  const tools = [{ type: 'function', function: { name: 'lookup', description: 'Look a word up',
    parameters: { type: 'object', properties: { word: { type: 'string' } }, required: ['word'] } } }];
  const r = await client.chat.completions.create({
    model: 'stories', max_tokens: 8, temperature: 0, tools,
    messages: [
      { role: 'user', content: 'What is a cat?' },
      { role: 'assistant', content: '', tool_calls: [{ id: 'call_1', type: 'function',
        function: { name: 'lookup', arguments: '{"word":"cat"}' } }] },
      { role: 'tool', tool_call_id: 'call_1', content: 'a small animal' },
    ],
  });
  assert.ok(['stop', 'length', 'tool_calls'].includes(r.choices[0].finish_reason));
});

test('errors: envelope and status codes', async () => {
  const post = (path, body, key = API_KEY) => fetch(`${base}${path}`, {
    method: 'POST', headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${key}` }, body,
  });
  let r = await post('/v1/chat/completions', '{"model": "stories", "messages": [');
  assert.equal(r.status, 400);
  assert.equal((await r.json()).error.type, 'invalid_request_error');
  await assert.rejects(client.chat.completions.create({ model: 'nope', messages: [{ role: 'user', content: 'x' }] }),
    (e) => e.status === 404);
  await assert.rejects(client.completions.create({ model: 'stories', prompt: 'x', max_tokens: 1000 }),
    (e) => e.status === 400 && e.code === 'context_length_exceeded');
  await assert.rejects(client.completions.create({ model: 'stories', prompt: 'x', temperature: -1 }),
    (e) => e.status === 400);
  r = await post('/v1/completions', '{"model":"stories","prompt":"x"}', 'wrong-key');
  assert.equal(r.status, 401);
  assert.ok((await r.json()).error.message.length > 0);
});

test('concurrency: 32 parallel greedy requests equal the same requests alone', async () => {
  const prompts = Array.from({ length: 32 }, (_, i) => `Once upon a time, a ${['cat', 'dog', 'bird', 'boy'][i % 4]} number ${i}`);
  const one = (p) => client.completions.create({ model: 'stories', prompt: p, max_tokens: 24, temperature: 0 })
    .then((r) => r.choices[0].text);
  const alone = [];
  for (const p of prompts.slice(0, 8)) alone.push(await one(p));
  const together = await Promise.all(prompts.map(one));
  assert.deepEqual(together.slice(0, 8), alone);
  await new Promise((r) => setTimeout(r, 300));
  assert.equal(await metric('kiln_kv_blocks_used'), 0);
});

test('cancellation: aborted streams free their sequences', async () => {
  const controllers = [];
  const runs = [];
  for (let i = 0; i < 6; i++) {
    const ac = new AbortController();
    controllers.push(ac);
    runs.push((async () => {
      try {
        const s = await client.completions.create({ model: 'stories', prompt: `Story ${i}:`, max_tokens: 200,
          temperature: 0.8, seed: i, stream: true }, { signal: ac.signal });
        let n = 0;
        for await (const _ of s) if (++n === 3) ac.abort();
      } catch {}
    })());
  }
  await Promise.all(runs);
  const end = Date.now() + 5000;
  while (Date.now() < end && (await metric('kiln_kv_blocks_used')) !== 0) await new Promise((r) => setTimeout(r, 100));
  assert.equal(await metric('kiln_kv_blocks_used'), 0);
  assert.equal(await metric('kiln_num_requests_running'), 0);
});

test('prefix cache: a shared long prefix is reused and changes nothing', async () => {
  const prefix = 'Once upon a time, there was a little girl named Lily. She loved to play outside. '.repeat(2);
  const a = await client.completions.create({ model: 'stories', prompt: prefix + 'One day', max_tokens: 16, temperature: 0 });
  const b = await client.completions.create({ model: 'stories', prompt: prefix + 'One day', max_tokens: 16, temperature: 0 });
  assert.equal(b.choices[0].text, a.choices[0].text);
  assert.ok(b.usage.prompt_tokens_details.cached_tokens >= 16, JSON.stringify(b.usage));
  assert.equal(b.usage.prompt_tokens_details.cached_tokens % 16, 0);
});
