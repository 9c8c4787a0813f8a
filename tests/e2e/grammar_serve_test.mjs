// End-to-end: structured output through a live `kiln serve` (the bundled kiln-tiny, and
// stories260K, a model that knows no JSON: without the mask its output would be noise), driven
// by the official `openai` npm client: response_format json_schema (strict) and json_object,
// guided_choice / guided_regex / grammar, a dead end finishing with `length`, and 400s that
// name what is wrong. Outputs are checked by hand-written validators here (the schemas are
// small) at temperature 1 with several seeds.
//   node --test tests/e2e/grammar_serve_test.mjs   (KILN_BIN, KILN_SHARED set by CTest)
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startKiln, stopKiln } from './lib/kiln_server.mjs';

const SHARED = process.env.KILN_SHARED;

async function startServer(args) {
  const { server, base } = await startKiln(['-t', '2', '--max-seqs', '4', '--model-name', 'm', ...args]);
  return { server, base, client: new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0 }) };
}

let tiny;
let stories;

before(async () => {
  tiny = await startServer(['--ctx', '1024']);
  stories = await startServer(['-m', `${SHARED}/models/stories260K.gguf`, '--ctx', '256']);
});

after(async () => {
  for (const s of [tiny, stories]) await stopKiln(s?.server);
});

const PERSON = {
  type: 'object',
  properties: {
    name: { type: 'string', maxLength: 12 },
    age: { type: 'integer', minimum: 0, maximum: 120 },
    color: { enum: ['red', 'green', 'blue'] },
    tags: { type: 'array', items: { type: 'string', maxLength: 6 }, maxItems: 3 },
  },
  required: ['name', 'age', 'color', 'tags'],
  additionalProperties: false,
};

function checkPerson(v) {
  assert.equal(typeof v, 'object');
  assert.deepEqual(Object.keys(v), ['name', 'age', 'color', 'tags']);
  assert.equal(typeof v.name, 'string');
  assert.ok([...v.name].length <= 12, v.name);
  assert.ok(Number.isInteger(v.age) && v.age >= 0 && v.age <= 120, String(v.age));
  assert.ok(['red', 'green', 'blue'].includes(v.color));
  assert.ok(Array.isArray(v.tags) && v.tags.length <= 3);
  for (const t of v.tags) assert.ok(typeof t === 'string' && [...t].length <= 6);
}

for (const which of ['tiny', 'stories']) {
  test(`${which}: response_format json_schema strict validates at temperature 1`, async () => {
    const { client } = which === 'tiny' ? tiny : stories;
    let complete = 0;
    for (const seed of [1, 2, 3, 4]) {
      const r = await client.chat.completions.create({
        model: 'm', messages: [{ role: 'user', content: 'Describe a person as JSON.' }],
        temperature: 1, seed, max_tokens: 150,
        response_format: { type: 'json_schema', json_schema: { name: 'person', strict: true, schema: PERSON } },
      });
      const c = r.choices[0];
      if (c.finish_reason === 'length') continue;  // cut by max_tokens: not claimed complete
      assert.equal(c.finish_reason, 'stop');
      checkPerson(JSON.parse(c.message.content));
      complete++;
    }
    assert.ok(complete >= 2, `only ${complete} of 4 outputs complete`);
  });
}

test('stories: json_object gives an object; completions with guided_regex and choice', async () => {
  const { client } = stories;
  const r = await client.chat.completions.create({
    model: 'm', messages: [{ role: 'user', content: 'JSON please' }], temperature: 1, seed: 5,
    max_tokens: 120, response_format: { type: 'json_object' },
  });
  if (r.choices[0].finish_reason === 'stop') {
    const v = JSON.parse(r.choices[0].message.content);
    assert.equal(typeof v, 'object');
    assert.ok(!Array.isArray(v) && v !== null);
  }
  const re = await client.completions.create({
    model: 'm', prompt: 'Once upon a time', max_tokens: 20, temperature: 1, seed: 9,
    guided_regex: '[0-9]{3}-[a-z]{2}',
  });
  assert.equal(re.choices[0].finish_reason, 'stop');
  assert.match(re.choices[0].text, /^[0-9]{3}-[a-z]{2}$/);
  const ch = await client.completions.create({
    model: 'm', prompt: 'The cat was', max_tokens: 10, temperature: 1, seed: 3, n: 3,
    guided_choice: ['happy', 'sad', 'very sleepy'],
  });
  for (const c of ch.choices) assert.ok(['happy', 'sad', 'very sleepy'].includes(c.text), c.text);
  const g = await client.completions.create({
    model: 'm', prompt: 'Lily said', max_tokens: 30, temperature: 1, seed: 4,
    grammar: 'root ::= "yes" | "no" ("!" | "?")\n',
  });
  assert.match(g.choices[0].text, /^(yes|no[!?])$/);
});

test('stories: a grammar longer than max_tokens ends with length, streaming too', async () => {
  const { client } = stories;
  const r = await client.completions.create({
    model: 'm', prompt: 'Once', max_tokens: 3, temperature: 0, guided_regex: 'a{40}',
  });
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.match(r.choices[0].text, /^a*$/);
  const stream = await client.chat.completions.create({
    model: 'm', messages: [{ role: 'user', content: 'hi' }], temperature: 1, seed: 2, max_tokens: 60,
    stream: true, guided_choice: ['alpha', 'beta'],
  });
  let text = '';
  let finish;
  for await (const chunk of stream) {
    const c = chunk.choices[0];
    if (!c) continue;
    text += c.delta?.content ?? '';
    finish = c.finish_reason ?? finish;
  }
  assert.equal(finish, 'stop');
  assert.ok(['alpha', 'beta'].includes(text), text);
});

test('bad constraints are 400s naming the problem', async () => {
  const { client } = stories;
  const cases = [
    [{ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', properties: { a: { not: {} } } } } } },
     /'not' at #\/properties\/a\/not/],
    [{ guided_grammar: 'root ::= "a" (\n' }, /line 2 column 1: expected '\)'/],
    [{ guided_regex: '(?=x)' }, /lookaround/],
    [{ guided_choice: [] }, /non-empty/],
    [{ guided_regex: 'a', guided_choice: ['b'] }, /both constrain/],
    // A few bytes asking for millions of rules, or for a billion live alternatives.
    [{ guided_regex: 'a{0,100000}'.repeat(11) }, /too large once its repetitions are expanded/],
    [{ guided_regex: '((a{0,1000}){0,1000}){0,1000}' }, /too ambiguous/],
    [{ guided_regex: '('.repeat(50000) + 'a' + ')'.repeat(50000) }, /nested deeper than 256/],
  ];
  for (const [extra, re] of cases) {
    await assert.rejects(
      client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'x' }], max_tokens: 5, ...extra }),
      (e) => e.status === 400 && re.test(e.message));
  }
});

const GET_WEATHER = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Current weather in a city.',
    parameters: {
      type: 'object',
      properties: { city: { type: 'string', maxLength: 20 }, unit: { enum: ['celsius', 'fahrenheit'] } },
      required: ['city'],
    },
  },
};
const DICTIONARY = {
  type: 'function',
  function: {
    name: 'dictionary',
    description: 'Look up the meaning of an English word in the dictionary.',
    parameters: { type: 'object', properties: { word: { type: 'string' } }, required: ['word'] },
  },
};

// tool_choice auto (the lazy grammar): kiln-tiny, trained to call `dictionary`, is offered only
// get_weather. Every reply is text or a get_weather call valid against its schema; a call of
// another tool (or a malformed one left in the content) fails. Random output at temperature 1
// over many seeds is the hard case: the grammar must hold whatever the model wants.
test('tiny: tool_choice auto answers in text or calls an offered tool with valid arguments', async () => {
  const { client } = tiny;
  let numCalls = 0;
  let numText = 0;
  for (let seed = 1; seed <= 16; seed++) {
    const r = await client.chat.completions.create({
      model: 'm', messages: [{ role: 'user', content: seed % 2 ? 'What does river mean?' : 'Weather in Paris?' }],
      temperature: 1, seed, max_tokens: 120, tools: [GET_WEATHER], tool_choice: 'auto',
    });
    const c = r.choices[0];
    // Every call that was completed is checked; a call cut by max_tokens stays as text.
    for (const call of c.message.tool_calls ?? []) {
      numCalls++;
      assert.equal(call.function.name, 'get_weather', JSON.stringify(c));
      const args = JSON.parse(call.function.arguments);
      assert.equal(typeof args.city, 'string');
      assert.ok([...args.city].length <= 20);
      if ('unit' in args) assert.ok(['celsius', 'fahrenheit'].includes(args.unit));
      assert.deepEqual(Object.keys(args).filter((k) => !['city', 'unit'].includes(k)), []);
    }
    if (c.finish_reason === 'length') continue;
    const text = c.message.content ?? '';
    assert.ok(!text.includes('<tool_call>'), `a call left as text: ${JSON.stringify(c)}`);
    if (c.message.tool_calls?.length) assert.equal(c.finish_reason, 'tool_calls');
    else numText++;
  }
  // kiln-tiny calls its tool on most of these prompts: the grammar turned those calls into
  // get_weather calls rather than suppressing them.
  assert.ok(numCalls > 0, 'no call in 16 replies');
  console.log(`auto on kiln-tiny: ${numCalls} get_weather calls, ${numText} text replies in 16`);
});


test('tiny: tool_choice required and named force a parsable call of an offered tool', async () => {
  const { client } = tiny;
  // Offered only get_weather, kiln-tiny (trained to call `dictionary`) must call get_weather.
  for (const seed of [1, 2, 3]) {
    const r = await client.chat.completions.create({
      model: 'm', messages: [{ role: 'user', content: 'What does river mean?' }], temperature: 1, seed,
      max_tokens: 120, tools: [GET_WEATHER], tool_choice: 'required', parallel_tool_calls: false,
    });
    const c = r.choices[0];
    assert.equal(c.finish_reason, 'tool_calls', JSON.stringify(c));
    assert.equal(c.message.tool_calls.length, 1);
    const call = c.message.tool_calls[0];
    assert.equal(call.function.name, 'get_weather');
    const args = JSON.parse(call.function.arguments);
    assert.equal(typeof args.city, 'string');
    assert.ok([...args.city].length <= 20);
    if ('unit' in args) assert.ok(['celsius', 'fahrenheit'].includes(args.unit));
    assert.deepEqual(Object.keys(args).filter((k) => !['city', 'unit'].includes(k)), []);
  }
  const named = await client.chat.completions.create({
    model: 'm', messages: [{ role: 'user', content: 'What does dog mean?' }], temperature: 0,
    max_tokens: 120, tools: [DICTIONARY, GET_WEATHER],
    tool_choice: { type: 'function', function: { name: 'get_weather' } },
  });
  const calls = named.choices[0].message.tool_calls;
  assert.ok(calls.length >= 1);
  for (const call of calls) assert.equal(call.function.name, 'get_weather');
  await assert.rejects(
    client.chat.completions.create({
      model: 'm', messages: [{ role: 'user', content: 'x' }], max_tokens: 5, tools: [GET_WEATHER],
      tool_choice: 'required', response_format: { type: 'json_object' },
    }),
    (e) => e.status === 400 && /cannot be combined/.test(e.message));
});
