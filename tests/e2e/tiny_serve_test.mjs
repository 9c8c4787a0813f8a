// End-to-end: `kiln serve` with no -m serves the bundled kiln-tiny (models/kiln-tiny.gguf,
// found beside the executable's folders), driven by the official `openai` npm client. Greedy
// answers to "What does WORD mean?" contain the expected definition words (WordNet's first
// gloss, tests/fixtures/kiln_tiny/eval_words.json), and with the dictionary tool offered the
// model calls it, then answers from the tool's result.
//   node --test tests/e2e/tiny_serve_test.mjs   (KILN_BIN set by CTest)
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import OpenAI from 'openai';
import { startKiln, stopKiln } from './lib/kiln_server.mjs';
import { DICTIONARY_TOOL, RIVER } from './lib/kiln_tiny.mjs';

const WORDS = JSON.parse(fs.readFileSync(new URL('../fixtures/kiln_tiny/eval_words.json', import.meta.url)));
const CHECKED = ['water', 'river', 'dog', 'apple', 'winter'];
const DICTIONARY = { type: 'function', function: DICTIONARY_TOOL };

let server;
let client;

before(async () => {
  const started = await startKiln(['-t', '2', '--ctx', '1024', '--max-seqs', '4']);
  server = started.server;
  const base = started.base;
  const log = started.log();
  assert.match(log, /kiln-tiny\.gguf/);  // the log names the bundled file it chose
  client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0 });
});

after(async () => {
  await stopKiln(server);
});

for (const word of CHECKED) {
  test(`"What does ${word} mean?" names its definition`, async () => {
    const entry = WORDS.find((w) => w.word === word);
    assert.ok(entry, `${word} is in eval_words.json`);
    const r = await client.chat.completions.create({
      model: 'kiln', temperature: 0, max_tokens: 16,  // the keywords open the gloss
      messages: [{ role: 'user', content: `What does ${word} mean?` }],
    });
    const text = r.choices[0].message.content;
    const hits = entry.keywords.filter((k) => text.toLowerCase().includes(k.toLowerCase()));
    assert.ok(hits.length >= 1, `answer '${text}' has none of ${entry.keywords.join(', ')}`);
    assert.ok(text.toLowerCase().startsWith(word), text);
  });
}

test('with the dictionary tool offered it calls it, then answers from the result', async () => {
  const messages = [{ role: 'user', content: 'What does river mean?' }];
  const r = await client.chat.completions.create({
    model: 'kiln', temperature: 0, max_tokens: 32, tools: [DICTIONARY], messages,
  });
  const choice = r.choices[0];
  assert.equal(choice.finish_reason, 'tool_calls', JSON.stringify(choice.message));
  const calls = choice.message.tool_calls;
  assert.equal(calls.length, 1);
  assert.equal(calls[0].function.name, 'dictionary');
  assert.deepEqual(JSON.parse(calls[0].function.arguments), { word: 'river' });

  messages.push(choice.message);
  messages.push({ role: 'tool', tool_call_id: calls[0].id,
                  content: RIVER });
  const r2 = await client.chat.completions.create({
    model: 'kiln', temperature: 0, max_tokens: 32, tools: [DICTIONARY], messages,
  });
  const text = r2.choices[0].message.content;
  assert.equal(r2.choices[0].finish_reason, 'stop');
  assert.match(text, /stream of water/, text);
});
