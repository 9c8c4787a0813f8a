// CPU reference ops: plain scalar code, written to be obviously right. Every fast kernel
// (SIMD here, CUDA later) is tested against these. Shapes are row-major with the last index
// contiguous: [n_tokens, n] means token t's vector starts at t * n.
//
// Reduction order is fixed per output element (it never depends on the batch composition or
// the thread count), so a sequence decodes to the same tokens alone or inside a batch.
#pragma once

#include <cstdint>

#include "kiln/backend/backend.h"
#include "kiln/backend/weight.h"
#include "kiln/quant/types.h"
#include "kiln/util/thread_pool.h"

namespace kiln::backend::cpu {

// out[t] = dequantized row tokens[t] of `table` ([n_vocab, n_embd] as rows): [n_tokens, n_embd]
void embed(const Weight& table, const int32_t* tokens, int64_t n_tokens, float* out);

// y = x / sqrt(mean(x^2) + eps) * w, per row of n.  x, y: [n_rows, n]; w: [n] (may be null)
void rmsnorm(const float* x, const float* w, float* y, int64_t n_rows, int64_t n, float eps);

// y = (x - mean) / sqrt(var + eps) * w + b per row of n, var the biased variance (as
// torch.nn.LayerNorm). x, y: [n_rows, n]; w, b: [n] (either may be null: 1, 0). y may alias x.
// Mean and variance in double over two passes (no cancellation when |mean| >> std), each
// output rounded once from double.
void layernorm(const float* x, const float* w, const float* b, float* y, int64_t n_rows, int64_t n,
               float eps);
// x += r, then y = layernorm(x) (the post-norm residual form). y may alias x or r.
void add_layernorm(float* x, const float* r, const float* w, const float* b, float* y,
                   int64_t n_rows, int64_t n, float eps);

// y[t][o] = sum_i W[o][i] * x[t][i].  x: [n_tokens, w.n_in], y: [n_tokens, w.n_out]. Runs the
// fast kernels (matmul.h); matmul_reference there is the plain dequantize-and-dot version.
void matmul(const Weight& w, const float* x, float* y, int64_t n_tokens, util::ThreadPool* pool);

// x[t][i] += b[i].  x: [n_tokens, n]
void add_bias(float* x, const float* b, int64_t n_tokens, int64_t n);

// x += y, n elements
void add(float* x, const float* y, int64_t n);

// Rotary embedding in place on the first n_rot dims of each head. x: [n_tokens, n_heads,
// head_dim]. neox: rotate pairs (i, i + n_rot/2); otherwise adjacent pairs (2i, 2i+1) (GGUF
// llama files, whose Q/K rows the converter permuted). theta = pos * base^(-2i/n_rot) / f[i]
// with freq_factors f ([n_rot / 2], llama3 rope scaling) or f = 1 when null.
void rope(float* x, const int32_t* positions, int64_t n_tokens, int32_t n_heads, int32_t head_dim,
          int32_t n_rot, float freq_base, bool neox, const float* freq_factors = nullptr);
// (The scalar reference: the forward uses rope_angles + rope_apply below, which give the same
// floats with the per-pair frequencies computed once per model and the angles once per step.)

// The angles of one step: cos[t][i] = attn_factor * cos(positions[t] * inv_freq[i]) (sin
// likewise), evaluated in double. inv_freq: [n_pairs]; cos, sin: [n_tokens, n_pairs].
void rope_angles(const double* inv_freq, int32_t n_pairs, const int32_t* positions,
                 int64_t n_tokens, float attn_factor, float* cos, float* sin);

// Rotates the first 2 * n_pairs dims of each head of x [n_tokens, n_heads, head_dim] in place
// by the step's angles (rope_angles), pairs as in rope().
void rope_apply(float* x, int64_t n_tokens, int32_t n_heads, int32_t head_dim, int32_t n_pairs,
                bool neox, const float* cos, const float* sin);

// out = silu(gate) * up, n elements.
void swiglu(const float* gate, const float* up, float* out, int64_t n);
// out = gelu_tanh(gate) * up (GELU with the tanh approximation, as gelu_pytorch_tanh).
void geglu(const float* gate, const float* up, float* out, int64_t n);

// out = 0.5 x (1 + erf(x / sqrt 2)) (exact GELU), n elements, evaluated in double as
// 0.5 x erfc(-x / sqrt 2) (the same function, without 1 + erf's cancellation for x < 0) and
// rounded once. out may alias x.
void gelu(const float* x, float* out, int64_t n);

// x *= s, n elements.
void scale(float* x, float s, int64_t n);
// x = cap * tanh(x / cap), n elements (logit soft-capping, Gemma 2).
void softcap(float* x, float cap, int64_t n);

// One layer's paged KV memory. Block b starts at k + b * k_block_bytes (V likewise). Per
// block and kv head (head-major, so one head's block is contiguous):
//  - F32/F16 K: [head_dim_k][block_tokens], transposed, so attention reads 16 keys of one
//    dim as one vector;
//  - Q8_0 K: [block_tokens][head_dim_k / 32 block_q8_0] (ggml's layout along head_dim);
//  - V (every type): [block_tokens][head_dim_v] rows of the type.
struct KvLayerView {
  quant::Type type = quant::Type::F32;  // F32, F16 or Q8_0
  uint8_t* k = nullptr;
  uint8_t* v = nullptr;
  int64_t k_block_bytes = 0;
  int64_t v_block_bytes = 0;
  int32_t block_tokens = 16;
  int32_t n_kv_heads = 0;
  int32_t head_dim_k = 0;
  int32_t head_dim_v = 0;

  // Bytes of one kv head's part of a block.
  int64_t k_head_bytes() const { return k_block_bytes / n_kv_heads; }
  int64_t v_head_bytes() const { return v_block_bytes / n_kv_heads; }
};

// A view of a layer of a cache of `type` with the given geometry (block_tokens per block).
KvLayerView make_kv_view(quant::Type type, uint8_t* k, uint8_t* v, int32_t block_tokens,
                         int32_t n_kv_heads, int32_t head_dim_k, int32_t head_dim_v);

// Writes each row's K and V ([n_tokens, n_kv_heads, head_dim], fp32) to its sequence's blocks
// at its position, converted to the cache type (F16 rounds to nearest even; Q8_0 as ggml's
// quantize_row_q8_0).
void kv_write(const KvLayerView& kv, const AttnBatch& b, const float* k, const float* v);

// Token `in_block` of kv head `kvh` in `block`, as fp32 (exact decoding of the stored type).
void kv_read_k(const KvLayerView& kv, int64_t block, int32_t in_block, int32_t kvh, float* out);
void kv_read_v(const KvLayerView& kv, int64_t block, int32_t in_block, int32_t kvh, float* out);

using backend::AttnParams;  // backend.h: heads, scale, softcap, sliding window

// Attention over the paged cache. q: [n_tokens, n_heads, head_dim_k], out: [n_tokens,
// n_heads, head_dim_v]. Causal: the query row at position p sees cache positions 0..p of its
// sequence (the last sliding_window of them when set); params.causal false: every position
// 0..kv_len - 1 of its sequence (no sliding window then). GQA: head h reads kv head
// h / (n_heads / n_kv_heads). Online softmax. The fast path is attention_avx2
// (attention.h); attention_reference is the scalar oracle.
void attention(const KvLayerView& kv, const AttnBatch& b, const float* q, float* out,
               const AttnParams& params, util::ThreadPool* pool);

// Which implementation attention() and the small ops run: the SIMD path when the CPU has
// one (AVX2+FMA+F16C), or the scalar references. KILN_SCALAR_OPS=1 in the environment starts
// in Reference (for before/after measurements).
enum class OpsMode { Fast, Reference };
void set_ops_mode(OpsMode mode);
OpsMode ops_mode();

// ---- gated delta net (qwen35/qwen3next linear attention; delta_net.cpp) ------------------

// out = x * sigmoid(gate), written x / (1 + exp(-gate)); n elements, out may alias x.
void sigmoid_mul(const float* x, const float* gate, float* out, int64_t n);
// Rows of src [n_rows, n_groups * 2 * width] are groups [a_g b_g] of width columns each:
// a [n_rows, n_groups * width] gets the a_g, b the b_g.
void deinterleave(const float* src, int64_t n_rows, int64_t n_groups, int64_t width, float* a,
                  float* b);

// One layer's recurrent state of every slot (the CPU backend's StateCache): slot s's conv
// state [conv_k - 1, conv_dim] (oldest input first) at conv + s * slot_stride and its SSM
// state [n_v_heads, head_k_dim, head_v_dim] (S[h][i][j], i over key dims) at
// ssm + s * slot_stride.
struct DeltaLayerView {
  float* conv = nullptr;
  float* ssm = nullptr;
  int64_t slot_stride = 0;  // floats from one slot's state to the next
  int32_t conv_dim = 0;
  int32_t conv_k = 0;
};

// Causal depthwise conv1d + SiLU (Backend::conv1d_silu) over the sequences of b: x, out
// [n_tokens, conv_dim], w [conv_dim, conv_k]; sequence s uses slot slots[s], from a zero state
// when positions[qo_indptr[s]] == 0, and leaves its last conv_k - 1 inputs there. Per output:
// a = sum over j in order of w[c][j] * input, out = a / (1 + exp(-a)). Threads split the
// channels (the arithmetic of each output is fixed). out must not alias x.
void conv1d_silu(const DeltaLayerView& st, const AttnBatch& b, const int32_t* slots, const float* x,
                 const float* w, float* out, util::ThreadPool* pool = nullptr);

// The gated delta rule (Backend::gated_delta_rule), token by token: the scalar oracle. Per row
// t and value head h (key head h % n_k_heads): q, k scaled by 1 / sqrt(sum x^2 + eps) (the sum
// in double), q then by 1 / sqrt(head_k_dim); beta = 1 / (1 + exp(-beta_raw)); g = ssm_a[h] *
// softplus(alpha + dt_bias[h]) (softplus as torch: x itself above 20); then
//   S *= exp(g); kv[j] = sum_i S[i][j] k[i]; delta[j] = (v[j] - kv[j]) * beta;
//   S[i][j] += k[i] delta[j]; o[j] = sum_i S[i][j] q[i]   (every sum in order of i).
// qkv [n_tokens, conv_dim] (q | k | v columns), alpha, beta [n_tokens, n_v_heads], ssm_a,
// dt_bias [n_v_heads], out [n_tokens, n_v_heads * head_v_dim]. Slots and zero starts as
// conv1d_silu.
void gated_delta_rule_reference(const DeltaLayerView& st, const AttnBatch& b, const int32_t* slots,
                                const float* qkv, const float* alpha, const float* beta,
                                const float* ssm_a, const float* dt_bias, float* out,
                                const DeltaParams& p);

// Which form gated_delta_rule runs per sequence: kAuto takes the chunked form for sequences of
// at least kDeltaChunkMinRows rows in the step, the recurrence otherwise.
enum class DeltaForm { kAuto, kRecurrent, kChunked };
constexpr int32_t kDeltaChunkRows = 64;
constexpr int32_t kDeltaChunkMinRows = 64;

// The gated delta rule on threads over (sequence, value head). The recurrence is the
// reference's arithmetic (bit for bit). The chunked form (chunks of kDeltaChunkRows, the
// recurrence across chunks; delta_net.cpp derives it) rounds differently: its outputs and state
// are within 2e-5 of the recurrence's scale (measured below 1e-6;
// tests/unit/backend/delta_net_test.cpp defines the scale).
void gated_delta_rule(const DeltaLayerView& st, const AttnBatch& b, const int32_t* slots,
                      const float* qkv, const float* alpha, const float* beta, const float* ssm_a,
                      const float* dt_bias, float* out, const DeltaParams& p,
                      util::ThreadPool* pool, DeltaForm form = DeltaForm::kAuto);

// Index of the largest value (first on ties).
int32_t argmax(const float* x, int64_t n);

}  // namespace kiln::backend::cpu
