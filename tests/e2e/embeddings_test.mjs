// End-to-end: `kiln serve --pooling last` on the bundled kiln-tiny (models/kiln-tiny.gguf, a
// decoder: its last token's final hidden state is the embedding, as Qwen3-Embedding's) driven
// by the official `openai` client through /v1/embeddings: unit norms, dimensions (Matryoshka:
// the leading values renormalized), a batch equal to its inputs one by one and in order,
// token-array inputs, base64 equal to float, usage, and the errors. Another server without
// --pooling answers 400 (a generation model serves no embeddings).
//   node --test tests/e2e/embeddings_test.mjs   (KILN_BIN set by CTest)
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startKiln, stopKiln } from './lib/kiln_server.mjs';

let server;
let base;
let client;

before(async () => {
  const started = await startKiln(['-t', '2', '--ctx', '256', '--max-seqs', '4',
                                   '--max-batch-tokens', '32', '--pooling', 'last']);
  server = started.server;
  base = started.base;
  client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0 });
});

after(async () => {
  await stopKiln(server);
});

const norm = (v) => Math.sqrt(v.reduce((s, x) => s + x * x, 0));
const TEXTS = ['What does river mean?', 'a', 'The cat sat on the mat, and then it slept for a long '
  + 'while in the warm afternoon sun, dreaming of fish and of the river beyond the hill.',
  'bank'];

// Equal within fp32 rounding of a different batch (the engine's sums run in another order).
function assertClose(a, b, what) {
  assert.equal(a.length, b.length, what);
  for (let i = 0; i < a.length; ++i)
    assert.ok(Math.abs(a[i] - b[i]) <= 1e-5, `${what}: [${i}] ${a[i]} vs ${b[i]}`);
}

test('one string: a unit vector of the model width, usage counts its tokens', async () => {
  const r = await client.embeddings.create({ model: 'kiln', input: 'What does river mean?',
                                            encoding_format: 'float' });
  assert.equal(r.object, 'list');
  assert.equal(r.model, 'kiln');
  assert.equal(r.data.length, 1);
  assert.equal(r.data[0].object, 'embedding');
  assert.equal(r.data[0].index, 0);
  const v = r.data[0].embedding;
  assert.ok(v.length >= 16, `width ${v.length}`);
  assert.ok(Math.abs(norm(v) - 1) < 1e-5, `norm ${norm(v)}`);
  assert.ok(r.usage.prompt_tokens > 3);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens);
});

test('a batch equals its inputs one by one, in order', async () => {
  const batch = await client.embeddings.create({ model: 'kiln', input: TEXTS });
  assert.equal(batch.data.length, TEXTS.length);
  let tokens = 0;
  for (let i = 0; i < TEXTS.length; ++i) {
    assert.equal(batch.data[i].index, i);
    const one = await client.embeddings.create({ model: 'kiln', input: TEXTS[i] });
    assertClose(batch.data[i].embedding, one.data[0].embedding, `input ${i}`);
    tokens += one.usage.prompt_tokens;
  }
  assert.equal(batch.usage.prompt_tokens, tokens);
  // Different texts give different vectors.
  const d = batch.data[0].embedding.reduce((s, x, k) => s + x * batch.data[2].embedding[k], 0);
  assert.ok(d < 0.9999, `cosine ${d}`);
});

test('dimensions keeps the leading values, renormalized', async () => {
  const full = (await client.embeddings.create({ model: 'kiln', input: 'bank' })).data[0].embedding;
  const cut = (await client.embeddings.create({ model: 'kiln', input: 'bank', dimensions: 8 }))
    .data[0].embedding;
  assert.equal(cut.length, 8);
  assert.ok(Math.abs(norm(cut) - 1) < 1e-5);
  const head = full.slice(0, 8);
  const n = norm(head);
  assertClose(cut, head.map((x) => x / n), 'matryoshka');
  await assert.rejects(client.embeddings.create({ model: 'kiln', input: 'bank',
                                                 dimensions: full.length + 1 }),
                       (e) => e.status === 400 && /dimensions/.test(e.message));
});

test('base64 decodes to the float vector', async () => {
  const f = await client.embeddings.create({ model: 'kiln', input: TEXTS[0],
                                            encoding_format: 'float' });
  const b = await client.embeddings.create({ model: 'kiln', input: TEXTS[0],
                                            encoding_format: 'base64' });
  assert.equal(typeof b.data[0].embedding, 'string');
  const buf = Buffer.from(b.data[0].embedding, 'base64');
  const floats = Array.from({ length: buf.length / 4 }, (_, i) => buf.readFloatLE(4 * i));
  assert.equal(floats.length, f.data[0].embedding.length);
  for (let i = 0; i < floats.length; ++i)
    assert.equal(floats[i], Math.fround(f.data[0].embedding[i]), `[${i}]`);
});

test('token arrays: one list and a list of lists', async () => {
  const ids = [[1, 50, 60, 70], [1, 80], [1, 90, 100]];
  const lists = await client.embeddings.create({ model: 'kiln', input: ids });
  assert.equal(lists.data.length, 3);
  assert.equal(lists.usage.prompt_tokens, 9);
  const one = await client.embeddings.create({ model: 'kiln', input: ids[1] });
  assertClose(lists.data[1].embedding, one.data[0].embedding, 'token list');
});

test('errors: empty input, too long, not an embeddings request', async () => {
  await assert.rejects(client.embeddings.create({ model: 'kiln', input: '' }),
                       (e) => e.status === 400 && e.error?.param === 'input');
  await assert.rejects(client.embeddings.create({ model: 'kiln', input: [] }),
                       (e) => e.status === 400);
  await assert.rejects(client.embeddings.create({ model: 'kiln', input: 'river '.repeat(400) }),
                       (e) => e.status === 400 && e.code === 'context_length_exceeded');
  const r = await fetch(`${base}/v1/embeddings`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'kiln', messages: [{ role: 'user', content: 'hi' }] }),
  });
  assert.equal(r.status, 400);
  assert.equal((await r.json()).error.param, 'input');
  await assert.rejects(client.embeddings.create({ model: 'other', input: 'x' }),
                       (e) => e.status === 404);
});

test('a generation model without --pooling serves no embeddings', async () => {
  const plain = await startKiln(['-t', '1', '--ctx', '128', '--max-seqs', '1']);
  try {
    const c = new OpenAI({ baseURL: `${plain.base}/v1`, apiKey: 'unused', maxRetries: 0 });
    await assert.rejects(c.embeddings.create({ model: 'kiln', input: 'river' }),
                         (e) => e.status === 400 && /--pooling/.test(e.message));
  } finally {
    await stopKiln(plain.server);
  }
});
