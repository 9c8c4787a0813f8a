// `kiln bench` reports every repetition, their spread and the thread placement, in the table
// and in JSON with llama-bench's field names (stories260K, a tiny real model).
//   node --test tests/e2e/bench_test.mjs   (KILN_BIN and KILN_SHARED set by CTest)
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import fs from 'node:fs';

const KILN = process.env.KILN_BIN;
const MODEL = `${process.env.KILN_SHARED}/models/stories260K.gguf`;

function bench(args) {
  return new Promise((resolve) => execFile(KILN, ['bench', '-m', MODEL, '-p', '16', '-n', '8', '-r', '4',
    '-t', '1', ...args], { timeout: 120000 }, (e, stdout, stderr) => resolve({ code: e ? e.code : 0, stdout, stderr })));
}

// The CPUs this process may run on, from /proc (what kiln's cpu_mask must name).
function allowedCpus() {
  const line = fs.readFileSync('/proc/self/status', 'utf8').split('\n').find((l) => l.startsWith('Cpus_allowed_list:'));
  const cpus = [];
  for (const part of line.split(':')[1].trim().split(',')) {
    const [a, b] = part.split('-').map(Number);
    for (let i = a; i <= (b ?? a); ++i) cpus.push(i);
  }
  return cpus;
}

test('bench --json: repetitions, spread and placement like llama-bench -o json', async () => {
  const r = await bench(['--json']);
  assert.equal(r.code, 0, r.stderr);
  const j = JSON.parse(r.stdout);
  assert.deepEqual(j.map((t) => t.test), ['pp16', 'tg8']);
  const cpus = allowedCpus();
  const mask = cpus.reduce((m, c) => m | (1n << BigInt(c)), 0n);
  for (const t of j) {
    const gen = t.test === 'tg8';
    assert.equal(t.samples_ts.length, 4);
    assert.equal(t.samples_ns.length, 4);
    assert.equal(t.repetitions, 4);
    assert.deepEqual(t.samples, t.samples_ts);
    const s = [...t.samples_ts].sort((a, b) => a - b);
    assert.equal(t.min_ts, s[0]);
    assert.equal(t.max_ts, s[3]);
    assert.ok(Math.abs(t.median_ts - (s[1] + s[2]) / 2) < 1e-9 * t.max_ts);
    const mean = s.reduce((a, b) => a + b) / 4;
    const sd = Math.sqrt(s.reduce((a, b) => a + (b - mean) ** 2, 0) / 3);
    assert.ok(Math.abs(t.avg_ts - mean) < 1e-9 * mean);
    assert.ok(Math.abs(t.stddev_ts - sd) < 1e-9 * mean + 1e-12);
    assert.equal(t.tok_per_s_mean, t.avg_ts);
    // samples_ns: the time of each repetition (its tokens / its tokens per second).
    t.samples_ts.forEach((ts, i) => assert.ok(Math.abs(t.samples_ns[i] - 8 * (gen ? 1 : 2) / ts * 1e9) < 1));
    assert.ok(t.min_ts > 0 && t.min_ts <= t.median_ts && t.median_ts <= t.max_ts);
    assert.equal(t.n_prompt, gen ? 0 : 16);
    assert.equal(t.n_gen, gen ? 8 : 0);
    // Placement.
    assert.equal(t.n_threads, 1);
    assert.equal(t.threads, 1);
    assert.equal(BigInt(t.cpu_mask), mask);
    assert.equal(t.cpu_strict, false);
    assert.equal(typeof t.cpu_info, 'string');
    assert.equal(typeof t.spin_us, 'number');
    assert.ok(t.n_physical_cores >= 1 && t.n_cpus_online >= cpus.length);
    assert.match(t.test_time, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/);
    assert.equal(t.type_k, 'f16');
    assert.equal(t.model_filename, MODEL);
  }
});

test('bench: the table shows min/median/max, each repetition and the placement', async () => {
  const r = await bench([]);
  assert.equal(r.code, 0, r.stderr);
  assert.match(r.stdout, /\| +t\/s \| +min \| +median \| +max \| +GB\/s \|/);
  assert.match(r.stdout, /\| +pp16 \| +[\d.]+ ± +[\d.]+ \| +[\d.]+ \| +[\d.]+ \| +[\d.]+ \|/);
  assert.match(r.stdout, /^pp16 t\/s by repetition: [\d.]+ [\d.]+ [\d.]+ [\d.]+$/m);
  assert.match(r.stdout, /^tg8 t\/s by repetition: [\d.]+ [\d.]+ [\d.]+ [\d.]+$/m);
  assert.match(r.stdout, /^threads: 1 on CPUs [\d,-]+ \(cpu_mask 0x[0-9a-f]+, .*not pinned/m);
});

// A narrowed affinity (taskset) is what the report names.
test('bench --json: cpu_mask and cpus follow the process affinity', async (t) => {
  const cpus = allowedCpus();
  if (cpus.length < 2) return t.skip('needs 2 CPUs');
  const last = cpus[cpus.length - 1];
  const r = await new Promise((resolve) => execFile('taskset', ['-c', String(last), KILN, 'bench', '-m', MODEL,
    '-p', '4', '-n', '2', '-r', '1', '-t', '1', '--json'], (e, stdout, stderr) => resolve({ e, stdout, stderr })));
  if (r.e?.code === 'ENOENT') return t.skip('needs taskset (util-linux)');
  assert.equal(r.e, null, r.stderr);
  for (const test of JSON.parse(r.stdout)) {
    assert.equal(test.cpus, String(last));
    assert.equal(test.cpu_mask, '0x' + (1n << BigInt(last)).toString(16));
  }
});

// --depth, --parallel and --roofline: the tests' names and fields as llama-bench's (`pp16 @ d32`,
// n_depth), P sequences' tokens per repetition, and the decode step's roofline after the table
// (markdown) or in the tg test's object (JSON).
test('bench --depth --parallel --roofline: names, n_depth and the roofline', async () => {
  const j = await bench(['-d', '32', '--parallel', '2', '--roofline', '--json']);
  assert.equal(j.code, 0, j.stderr);
  const tests = JSON.parse(j.stdout);
  assert.deepEqual(tests.map((t) => t.test), ['pp16 x2 @ d32', 'tg8 x2 @ d32']);
  for (const t of tests) {
    assert.equal(t.n_depth, 32);
    assert.equal(t.n_seqs, 2);
    assert.equal(t.n_tokens, t.test.startsWith('tg') ? 16 : 32);
    assert.equal(t.n_gen, t.test.startsWith('tg') ? 8 : 0);
  }
  assert.equal(tests[0].roofline, undefined);
  const r = tests[1].roofline;
  assert.ok(r.copy_gb_per_s > 0);
  assert.equal(r.n_seqs, 2);
  assert.equal(r.n_depth, 32);
  const kinds = r.rows.map((x) => x.kind);
  assert.deepEqual(kinds.slice(-5), ['matmuls', 'attention', 'other', 'eager_step', 'tg_step']);
  const classes = r.rows.filter((x) => x.kind === 'class');
  assert.equal(classes.length, 5);
  const sum = classes.reduce((a, x) => a + x.bytes_per_step, 0);
  assert.equal(r.rows.find((x) => x.kind === 'matmuls').bytes_per_step, sum);

  const table = await bench(['-d', '32', '--parallel', '2', '--roofline']);
  assert.equal(table.code, 0, table.stderr);
  assert.match(table.stdout, /\| +tg8 x2 @ d32 \| +[\d.]+ ± +[\d.]+ \|/);
  assert.match(table.stdout, /^roofline of a decode step: 2 sequences after 32 tokens of context/m);
  assert.match(table.stdout, /^\| class +\| calls\/step \| +MB\/step \| +us\/step \| +GB\/s \| +% copy \|$/m);
  assert.match(table.stdout, /^\| f32 64x172 +\| +5\.00 \| +0\.220 \| +[\d.]+ \| +[\d.]+ \| +[\d.]+ \|$/m);
  assert.match(table.stdout, /^\| step \(tg\) +\| +1\.00 \|/m);

  const depth0 = await bench(['--json']);
  for (const t of JSON.parse(depth0.stdout)) assert.equal(t.n_depth, 0);
  const noGen = await new Promise((resolve) => execFile(KILN, ['bench', '-m', MODEL, '-n', '0', '--roofline'],
    (e, stdout, stderr) => resolve({ code: e ? e.code : 0, stderr })));
  assert.equal(noGen.code, 2);
  assert.match(noGen.stderr, /--roofline.*-n > 0/);
});
