// Soak: 500 requests at concurrency 16 against a live `kiln serve` (stories260K), with random
// parameters, random client aborts (before the answer, mid-stream, mid-body) and a few bad
// requests. It passes when no request got a 5xx, every request that was not aborted and was
// valid succeeded, the bad ones got their 4xx, all KV blocks are back in the pool afterwards,
// and the server exits cleanly on SIGTERM with no sanitizer report. In the ASan/UBSan build
// this test is labelled `unit` so `make test` runs it there (tests/cmake/cli.cmake).
//   node --test tests/e2e/soak_test.mjs   (KILN_BIN and KILN_SHARED set by CTest)
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';

const KILN = process.env.KILN_BIN;
const SHARED = process.env.KILN_SHARED;
const MODEL = `${SHARED}/models/stories260K.gguf`;
const NUM_REQUESTS = Number(process.env.KILN_SOAK_REQUESTS ?? 500);
const CONCURRENCY = 16;

let server;
let base;
let log = '';
let exited = null;

// A seeded generator, so a failure can be replayed (the seed is printed).
const SEED = Number(process.env.KILN_SOAK_SEED ?? Date.now() % 1000000);
let state = SEED;
function rand() {
  state = (state * 1103515245 + 12345) % 2147483648;
  return state / 2147483648;
}
const pick = (a) => a[Math.floor(rand() * a.length)];
const int = (lo, hi) => lo + Math.floor(rand() * (hi - lo + 1));

async function metric(name) {
  const text = await (await fetch(`${base}/metrics`)).text();
  const line = text.split('\n').find((l) => l.startsWith(name + ' '));
  return line === undefined ? undefined : Number(line.split(' ').pop());
}

before(async () => {
  server = spawn(KILN, ['serve', '-m', MODEL, '--port', '0', '--model-name', 'stories', '-t', '2',
                        '--ctx', '256', '--max-seqs', '16', '--max-batch-tokens', '256'],
                 { stdio: ['ignore', 'ignore', 'pipe'] });
  const port = await new Promise((resolve, reject) => {
    server.stderr.on('data', (d) => {
      log += d.toString();
      const m = log.match(/listening on http:\/\/[^:]+:(\d+)/);
      if (m) resolve(Number(m[1]));
    });
    server.on('exit', (code, signal) => {
      exited = { code, signal };
      reject(new Error(`kiln serve exited ${code}: ${log}`));
    });
  });
  base = `http://127.0.0.1:${port}`;
  const end = Date.now() + 120000;
  for (;;) {
    try {
      if ((await fetch(`${base}/health`)).status === 200) break;
    } catch {}
    if (Date.now() > end) throw new Error('server did not become healthy');
    await new Promise((r) => setTimeout(r, 100));
  }
});

after(async () => {
  if (exited === null) server.kill('SIGKILL');
});

const WORDS = ['Once', 'upon', 'a', 'time', 'there', 'was', 'little', 'girl', 'named', 'Lily', 'dog',
  'park', 'happy', 'sun', 'ball', 'tree', 'said', 'mom', 'play', 'friend'];

// One random request: its body, where it goes, and how (if at all) the client aborts it.
function randomCase(i) {
  const chat = rand() < 0.5;
  const stream = rand() < 0.6;
  const prompt = Array.from({ length: int(1, 60) }, () => pick(WORDS)).join(' ');
  const body = { model: 'stories', max_tokens: int(1, 48), seed: int(0, 1 << 30) };
  if (chat) body.messages = [{ role: 'user', content: prompt }];
  else body.prompt = rand() < 0.2 ? [prompt, prompt + ' again'] : prompt;
  if (rand() < 0.5) body.temperature = rand() * 1.5;
  if (rand() < 0.3) body.top_p = 0.1 + rand() * 0.9;
  if (rand() < 0.3) body.top_k = int(-1, 40);
  if (rand() < 0.2) body.min_p = rand() * 0.3;
  if (rand() < 0.2) body.frequency_penalty = rand() * 2 - 1;
  if (rand() < 0.2) body.presence_penalty = rand() * 2 - 1;
  if (rand() < 0.2) body.repetition_penalty = 0.8 + rand() * 0.6;
  if (rand() < 0.2) body.n = int(1, 3);
  if (rand() < 0.2) body.stop = [pick(WORDS), pick(WORDS)];
  if (rand() < 0.2) body.ignore_eos = true;
  if (rand() < 0.15) {
    if (chat) { body.logprobs = true; body.top_logprobs = int(0, 3); } else body.logprobs = int(0, 3);
  }
  if (!chat && rand() < 0.1) body.echo = true;
  if (stream) {
    body.stream = true;
    if (rand() < 0.5) body.stream_options = { include_usage: true };
  }
  let expect = 'ok';
  const r = rand();
  if (r < 0.05) { body.temperature = -1; expect = 400; }
  else if (r < 0.08) { body.max_tokens = 100000; expect = 400; }
  else if (r < 0.10) { body.model = 'nope'; expect = 404; }
  // Aborts: before the response, after a few stream chunks, or during a whole-body wait.
  const a = rand();
  const abort = expect !== 'ok' ? 'none' : a < 0.1 ? 'early' : a < 0.3 ? 'mid' : 'none';
  return { i, path: chat ? '/v1/chat/completions' : '/v1/completions', body, stream, expect,
           abort, abortAfter: int(1, 6), abortMs: int(1, 40) };
}

async function runCase(c) {
  const ac = new AbortController();
  let timer;
  if (c.abort === 'early' || (c.abort === 'mid' && !c.stream)) timer = setTimeout(() => ac.abort(), c.abortMs);
  try {
    const res = await fetch(`${base}${c.path}`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(c.body),
      signal: ac.signal,
    });
    if (!c.stream || res.status !== 200) {
      const text = await res.text();
      return { status: res.status, text };
    }
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let text = '';
    let chunks = 0;
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      text += decoder.decode(value, { stream: true });
      if (c.abort === 'mid' && ++chunks >= c.abortAfter) {
        ac.abort();
        return { status: 'aborted' };
      }
    }
    return { status: res.status, text };
  } catch (e) {
    if (ac.signal.aborted) return { status: 'aborted' };
    return { status: 'network', text: String(e) };
  } finally {
    clearTimeout(timer);
  }
}

test(`soak: ${NUM_REQUESTS} random requests at concurrency ${CONCURRENCY} with aborts`, async () => {
  const cases = Array.from({ length: NUM_REQUESTS }, (_, i) => randomCase(i));
  const results = new Array(NUM_REQUESTS);
  let next = 0;
  const t0 = Date.now();
  await Promise.all(Array.from({ length: CONCURRENCY }, async () => {
    for (let i = next++; i < NUM_REQUESTS; i = next++) results[i] = await runCase(cases[i]);
  }));
  const seconds = (Date.now() - t0) / 1000;
  const failures = [];
  const counts = {};
  for (let i = 0; i < NUM_REQUESTS; i++) {
    const c = cases[i];
    const r = results[i];
    counts[r.status] = (counts[r.status] ?? 0) + 1;
    if (typeof r.status === 'number' && r.status >= 500) failures.push(`#${i} got ${r.status}: ${r.text}`);
    else if (r.status === 'network') failures.push(`#${i} network error: ${r.text}`);
    else if (r.status === 'aborted') { if (c.abort === 'none') failures.push(`#${i} aborted unasked`); }
    else if (c.expect === 'ok' && r.status !== 200) failures.push(`#${i} expected 200, got ${r.status}: ${r.text}`);
    else if (c.expect !== 'ok' && r.status !== c.expect) failures.push(`#${i} expected ${c.expect}, got ${r.status}`);
    else if (r.status === 200 && c.stream && !r.text.endsWith('data: [DONE]\n\n')) failures.push(`#${i} stream without [DONE]`);
    else if (r.status === 200 && c.stream && r.text.includes('"error"')) failures.push(`#${i} error frame: ${r.text.slice(-300)}`);
  }
  console.log(`soak seed ${SEED}: ${NUM_REQUESTS} requests in ${seconds.toFixed(1)} s: ${JSON.stringify(counts)}`);
  assert.deepEqual(failures.slice(0, 10), [], `seed ${SEED}; server: ${JSON.stringify(exited)} ${log.slice(-3000)}`);
  // Every aborted or finished sequence gave its blocks back (cached blocks are free).
  const end = Date.now() + 10000;
  while (Date.now() < end && ((await metric('kiln_kv_blocks_used')) !== 0 ||
                              (await metric('kiln_num_requests_running')) !== 0)) {
    await new Promise((r) => setTimeout(r, 100));
  }
  assert.equal(await metric('kiln_kv_blocks_used'), 0);
  assert.equal(await metric('kiln_num_requests_running'), 0);
  assert.equal(await metric('kiln_num_requests_waiting'), 0);
  assert.equal((await fetch(`${base}/health`)).status, 200);

  // A clean exit: status 0 and nothing from AddressSanitizer/LeakSanitizer/UBSan.
  const exit = new Promise((r) => server.on('exit', (code, signal) => r({ code, signal })));
  server.kill('SIGTERM');
  const { code, signal } = await exit;
  exited = { code, signal };
  assert.doesNotMatch(log, /AddressSanitizer|LeakSanitizer|runtime error:/, log.slice(-4000));
  assert.equal(signal, null, log.slice(-2000));
  assert.equal(code, 0, log.slice(-2000));
});
