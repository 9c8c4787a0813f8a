// CUDA kernels of the ops interface, as free functions over device pointers on a stream.
// CudaBackend (cuda_backend.cpp) calls them; tests/unit/cuda/ checks each against the CPU op
// of the same name (backend/cpu/ops.h, matmul.h) on random inputs. Shapes are row-major with
// the last index contiguous, as on the CPU: [n_tokens, n] means row t starts at t * n.
// Every pointer named *_dev / every float* argument is device memory unless said otherwise.
// No kernel allocates, and none synchronises the host: all are capturable in a CUDA graph.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "kiln/backend/weight.h"
#include "kiln/quant/types.h"

namespace kiln::backend::cuda {

// ---- elementwise and row ops (ops_elementwise.cu) ----------------------------------------

// y = x / sqrt(mean(x^2) + eps) * w per row of n (w may be null). x and y may alias.
// With yq/yds (device [n_rows, n] int8 and [n_rows, n / 32] pairs), y is also quantized as
// quantize_q8_32 would (for the matvec): done, and true returned, when n % 32 == 0 and the rows
// are 16-byte aligned.
bool rmsnorm(const float* x, const float* w, float* y, int64_t n_rows, int64_t n, float eps,
             cudaStream_t s, int8_t* yq = nullptr, float2* yds = nullptr);
// x += r, then y = rmsnorm(x) * w, in one pass (bitwise what add then rmsnorm give); y must not
// alias x or r. yq/yds as rmsnorm.
bool add_rmsnorm(float* x, const float* r, const float* w, float* y, int64_t n_rows, int64_t n,
                 float eps, cudaStream_t s, int8_t* yq = nullptr, float2* yds = nullptr);
// y = (x - mean) / sqrt(var + eps) * w + b per row of n, var the biased variance (w, b may be
// null: 1, 0), as cpu::layernorm: the statistics in double, two passes. x and y may alias.
void layernorm(const float* x, const float* w, const float* b, float* y, int64_t n_rows, int64_t n,
               float eps, cudaStream_t s);
// x += r, then y = layernorm(x), in one kernel (bitwise what add then layernorm give); y may
// alias x or r.
void add_layernorm(float* x, const float* r, const float* w, const float* b, float* y,
                   int64_t n_rows, int64_t n, float eps, cudaStream_t s);
// x[t][i] += b[i]; x: [n_rows, n]
void add_bias(float* x, const float* b, int64_t n_rows, int64_t n, cudaStream_t s);
// x += y, n elements
void add(float* x, const float* y, int64_t n, cudaStream_t s);
// x *= s, n elements
void scale(float* x, float scale, int64_t n, cudaStream_t s);
// x = cap * tanh(x / cap)
void softcap(float* x, float cap, int64_t n, cudaStream_t s);
// out = silu(gate) * up / gelu_tanh(gate) * up; out may alias gate.
void swiglu(const float* gate, const float* up, float* out, int64_t n, cudaStream_t s);
void geglu(const float* gate, const float* up, float* out, int64_t n, cudaStream_t s);
// out = 0.5 x (1 + erf(x / sqrt 2)) (exact GELU), n elements; out may alias x.
void gelu(const float* x, float* out, int64_t n, cudaStream_t s);
// swiglu, with out also quantized as quantize_q8_32 (q [n], ds [n / 32]) for the matvec; true
// when it was (n % 32 == 0, 16-byte aligned), else plain swiglu.
bool swiglu_q8(const float* gate, const float* up, float* out, int64_t n, int8_t* q, float2* ds,
               cudaStream_t s);
// Copies columns [col0, col0 + n_cols) of src [n_rows, src_cols] to dst [n_rows, n_cols].
void copy_cols(const float* src, int64_t src_cols, int64_t col0, float* dst, int64_t n_cols,
               int64_t n_rows, cudaStream_t s);
// dst[i] = src[rows[i]] for i < n_out; rows of n floats. rows: device int32 [n_out].
void gather_rows(const float* src, const int32_t* rows, float* dst, int64_t n_out, int64_t n,
                 cudaStream_t s);
// y = x * per-row scale s[t] (mistral3 query temperature), x [n_rows, n], s device [n_rows]
void scale_rows(float* x, const float* s, int64_t n_rows, int64_t n, cudaStream_t st);
// x[t] += sigmoid(s[t]) * y[t] over [n_rows, n].
void add_gated_rows(float* x, const float* y, const float* s, int64_t n_rows, int64_t n,
                    cudaStream_t st);

// out[t] = dequantized row tokens[t] of `table` (table.data is device memory holding the GGUF
// rows as stored): [n_tokens, table.n_in]. Bit-exact with quant::dequantize_row.
void embed(const Weight& table, const int32_t* tokens, int64_t n_tokens, float* out,
           cudaStream_t s);

// Rotary embedding, the CPU's rope_angles + rope_apply: cos/sin [n_tokens, n_pairs] from
// inv_freq (device double [n_pairs]) and positions (device int32 [n_tokens]), evaluated in
// double then scaled by attn_factor; then x [n_tokens, n_heads, head_dim] rotated in place
// (neox: pairs (i, i + n_pairs); else (2i, 2i+1)).
void rope_angles(const double* inv_freq, int32_t n_pairs, const int32_t* positions,
                 int64_t n_tokens, float attn_factor, float* cos, float* sin, cudaStream_t s);
void rope_apply(float* x, int64_t n_tokens, int32_t n_heads, int32_t head_dim, int32_t n_pairs,
                bool neox, const float* cos, const float* sin, cudaStream_t s);
// rope_apply on x [n_tokens, n_heads, ..] and x2 [n_tokens, n_heads2, ..] in one launch (q, k).
void rope_apply2(float* x, int32_t n_heads, float* x2, int32_t n_heads2, int64_t n_tokens,
                 int32_t head_dim, int32_t n_pairs, bool neox, const float* cos, const float* sin,
                 cudaStream_t s);

// out = x * sigmoid(gate) as cpu::sigmoid_mul writes it (x / (1 + exp(-gate))), n elements;
// out may alias x.
void sigmoid_mul(const float* x, const float* gate, float* out, int64_t n, cudaStream_t s);
// Rows of src [n_rows, n_groups * 2 * width] are groups [a_g b_g] of width columns each: a, b
// [n_rows, n_groups * width] get the a_g and the b_g (cpu::deinterleave).
void deinterleave(const float* src, int64_t n_rows, int64_t n_groups, int64_t width, float* a,
                  float* b, cudaStream_t s);

// Index of the largest value of each row (first on ties): out [n_rows]
void argmax_rows(const float* x, int64_t n_rows, int64_t n, int32_t* out, cudaStream_t s);

// ---- gated delta net (delta_net.cu) ---------------------------------------------------------

// One layer's recurrent state of every slot (the CUDA backend's StateCache), laid out as
// cpu::DeltaLayerView: slot s's conv state [conv_k - 1, conv_dim] (oldest input first) at
// conv + s * slot_stride, its SSM state [n_v_heads, head_k_dim, head_v_dim] at
// ssm + s * slot_stride.
struct DeltaLayer {
  float* conv = nullptr;
  float* ssm = nullptr;
  int64_t slot_stride = 0;
  int32_t conv_dim = 0;
  int32_t conv_k = 0;
};
// backend::DeltaParams.
struct DeltaShape {
  int32_t n_k_heads = 0;
  int32_t n_v_heads = 0;
  int32_t head_k_dim = 0;  // at most kDeltaMaxHeadDimK
  int32_t head_v_dim = 0;
  float norm_eps = 1e-6f;
  bool tiled_heads = true;  // backend::DeltaParams::key_head
};
// The largest head_k_dim gated_delta_rule takes (a thread holds a state column in registers).
constexpr int32_t kDeltaMaxHeadDimK = 128;

// cpu::conv1d_silu: the causal depthwise conv1d + SiLU over each sequence of b (device
// metadata; slots device int32 [b.num_seqs]), from a zero conv state when the sequence's first
// row is position 0, leaving its last conv_k - 1 inputs in its slot. x, out [n_tokens,
// conv_dim] (out must not alias x), w [conv_dim, conv_k]. The same products summed in the same
// order as the CPU; only expf differs (2 ulp).
void conv1d_silu(const DeltaLayer& st, const AttnBatch& b, const int32_t* slots, int64_t n_tokens,
                 const float* x, const float* w, float* out, cudaStream_t s);
// Which form gated_delta_rule takes: kAuto chunks the runs of kDeltaChunkRows+ rows and runs
// the recurrence on the rest (as cpu::DeltaForm::kAuto).
enum class DeltaKernel { kAuto, kRecurrent, kChunked };
// cpu::gated_delta_rule on the GPU. The recurrence: a CTA per (sequence, value head, 32 state
// columns), each lane holding a part of its column of the head's state in registers (the CTA's
// warps split the rows), the rows one after the other; the L2 norms' sums in double, the dot
// products in partial sums per warp, FMA-contracted. The chunked form: a CTA per (sequence, value
// head, 32 state columns) over chunks of 64 rows in shared memory (cpu::gated_delta_rule's
// chunked form, sums in other orders, FMA-contracted). qkv [n_tokens, conv_dim], alpha, beta
// [n_tokens, n_v_heads], ssm_a, dt_bias [n_v_heads], out [n_tokens, n_v_heads * head_v_dim].
void gated_delta_rule(const DeltaLayer& st, const AttnBatch& b, const int32_t* slots,
                      int64_t n_tokens, const float* qkv, const float* alpha, const float* beta,
                      const float* ssm_a, const float* dt_bias, float* out, const DeltaShape& p,
                      DeltaKernel kernel, cudaStream_t s);

// ---- mixture of experts (moe.cu) ------------------------------------------------------------

// Per token: softmax of logits [n_tokens, n_expert], the k largest (ties to the lower expert
// index), their probabilities renormalised to sum 1. chosen [n_tokens, k] int32 (expert ids,
// in descending probability order), weights [n_tokens, k]; x_rows [n_tokens * k] = t (the
// token row of pair t*k+j), for matmul_id. 1 <= k <= 32, k <= n_expert <= 3072.
void moe_topk(const float* logits, int64_t n_tokens, int32_t n_expert, int32_t k, int32_t* chosen,
              float* weights, int32_t* x_rows, cudaStream_t s);
// An expert-parallel rank holds experts [first, first + held): each pair chosen one of them
// gets its index among them; any other pair expert 0 and weight 0 (it adds nothing).
void moe_localize(int32_t* chosen, float* weights, int64_t pairs, int32_t first, int32_t held,
                  cudaStream_t s);
// out[t] = sum over j in slot order of weights[t*k+j] * slots[(t*k+j)] (rows of n): [n_tokens, n]
void moe_combine(const float* slots, const float* weights, int64_t n_tokens, int32_t k, int64_t n,
                 float* out, cudaStream_t s);

// ---- the MoE block of a decode step in fewer launches (moe_decode.cu) ------------------------

// The router's logits and moe_topk in one launch, for n_tokens <= kMatvecMaxTokens: logits
// [n_tokens, router.n_out] = router x (an F32 router, as real files keep it: fp32 FMAs on x
// [n_tokens, router.n_in]; a quantized one of the matvec's types: the int8 dot products of
// matvec_q8 on xq / xds, its bits), then the last CTA to finish routes every token as moe_topk
// does (its bits, from these logits). counter: one device word, 0 between launches (the last
// CTA puts it back). False (nothing launched) for another router type or shape, or missing
// inputs.
bool moe_route(const Weight& router, const float* x, const int8_t* xq, const float2* xds,
               int64_t n_tokens, int32_t k, float* logits, int32_t* chosen, float* weights,
               int32_t* x_rows, uint32_t* counter, cudaStream_t s);
// The experts' down projection and moe_combine in one launch: out [n_tokens, stacked.n_out] =
// sum over j in slot order of weights[t*k+j] * (W_{ids[t*k+j]} x[x_rows[t*k+j]]) (x_rows null:
// pair p reads row p), each product matvec_id's bits and the sum moe_combine's (products and
// adds rounded in slot order from 0); a pair whose id is outside [0, n_expert) adds 0. x
// quantized by quantize_q8_32 (rows of stacked.n_in). False (nothing launched) for a type
// matvec_q8 does not take, or k > 32.
bool moe_down_combine(const Weight& stacked, int64_t n_expert, const int8_t* xq, const float2* xds,
                      const int32_t* x_rows, const int32_t* ids, const float* weights,
                      int64_t n_tokens, int32_t k, float* out, cudaStream_t s);

// ---- weights and matmul (matmul.cu, dequant.cu) --------------------------------------------

// Whether dequantize/matmul support the type on CUDA (every type quant::dequantize_row does).
bool supports_type(quant::Type t);
// Dequantizes n_rows rows of w (device GGUF rows) starting at row0 to fp32 / fp16 / bf16
// [n_rows, w.n_in]. fp32 output is bit-exact with quant::dequantize_row.
void dequantize_rows_f32(const Weight& w, int64_t row0, int64_t n_rows, float* out, cudaStream_t s);
void dequantize_rows_f16(const Weight& w, int64_t row0, int64_t n_rows, uint16_t* out,
                         cudaStream_t s);
// Whether rows of 2,048+ values are dequantized a CTA per row (dequant.cu; the same values).
// KILN_CUDA_DEQUANT_ROWS=1 / 0 sets it at start; tests flip it.
void dequant_set_row_ctas(bool on);

// Scratch memory and library handles the matmul needs, made once (no allocation per call).
struct MatmulContext;
// max_tokens: the largest n_tokens of any call; max_n_in / max_n_out: the largest weight;
// max_pairs / max_experts: the largest n_pairs and n_expert of any matmul_id call (0: no
// matmul_id). (The two MoE bounds were added by the matmul author: matmul_id plans its
// per-expert tiles on the device into scratch sized by them.) Null when the device memory or
// the cuBLAS handle cannot be had.
MatmulContext* create_matmul_context(int64_t max_tokens, int64_t max_n_in, int64_t max_n_out,
                                     int64_t max_pairs = 0, int64_t max_experts = 0);
void destroy_matmul_context(MatmulContext* ctx);
// Bytes of device scratch the context holds (for the memory plan).
uint64_t matmul_context_bytes(const MatmulContext* ctx);
// y[t][o] = sum_i W[o][i] * x[t][i]; x [n_tokens, w.n_in] fp32, y [n_tokens, w.n_out] fp32,
// w.data device memory holding the GGUF rows. Small n_tokens: kernels that read the quantized
// rows directly (for Q4_0/Q8_0/Q4_K/Q5_K/Q6_K the int8 matvec up to 8 tokens: activations
// rounded to int8 per 32 values, ~5e-3; then for Q4_K, Q5_K, Q6_K and Q8_0 the fp16 MMA of
// mmh.h up to 128 tokens, the weights dequantized in registers (fp16 operands, as cuBLAS), for
// Q4_0 the int8 MMA of mmq.h up to 64; each up to 16 only for weights under 4096 x 4096 values);
// larger: dequantized tiles through cuBLAS on the tensor cores.
// (matmul.cu) Precision: n_tokens <= 8 with n_in % 8 == 0 is fp32 arithmetic on the exact
// weights (within ~1e-5 of the reference, relative to the output norm), and y[t] does not
// depend on n_tokens or the other tokens; above, F32 weights are a plain fp32 GEMM (~1e-5) and
// every other type rounds weights and activations to fp16 (~5e-4; activations beyond +-65504
// overflow). w.data must be 2-byte aligned; rows whose base and byte length are multiples of 16
// (of 8 for Q3_K, Q6_K and Q8_K) are copied in the widest loads: all Llama-sized rows are.
void matmul(MatmulContext* ctx, const Weight& w, const float* x, float* y, int64_t n_tokens,
            cudaStream_t s);
// y_i = W_i x for n_w weights of one input x [n_tokens, n_in] (each W_i.n_in == n_in): as
// matmul for each, but x is quantized once for the int8 matvec path, and the weights mmh takes
// share launches (one per type); there a weight mmh would leave to cuBLAS as too short (9..128
// tokens) joins when a long weight of its type is in the call, and gets what mmh alone gives it.
// x_quantized: the context's int8 activations (matmul_q8) already hold x quantized (a producer
// wrote them). Returns whether they hold x quantized afterwards.
bool matmul_shared(MatmulContext* ctx, const Weight* const* ws, float* const* ys, int n_w,
                   const float* x, int64_t n_tokens, cudaStream_t s, bool x_quantized = false);
// The context's int8 activation buffers: [max_tokens, max_cols] levels and [.., / 32] pairs,
// for a producer (rmsnorm, swiglu) to quantize a matmul's input into.
struct MatmulQ8 {
  int8_t* xq = nullptr;
  float2* xds = nullptr;
  int64_t max_tokens = 0, max_cols = 0;
};
MatmulQ8 matmul_q8(MatmulContext* ctx);
// MoE expert matmul: for each pair p < n_pairs, y[p] = W_{ids[p]} . x[x_rows[p]], W_e expert e
// of a stacked weight (n_expert matrices of stacked.n_out rows each, back to back: expert e
// starts at stacked.data + e * n_out * row_bytes). ids, x_rows: device int32 [n_pairs], each id
// in [0, n_expert) (a pair with another id is left unwritten), each x row < n_x_rows; x
// [n_x_rows, n_in], y [n_pairs, n_out]. Pairs are grouped by expert on the device. Up to 64
// pairs (decode), and for types mmq does not take, each expert's rows are read once per 8 of
// its pairs by the direct kernels (fp32 arithmetic, ~1e-5); above, Q4_0/Q8_0/Q4_K/Q5_K/Q6_K go
// to the grouped int8 MMA (mmq.h mmq_id: x rounded to int8 per 32 values, as mmq, ~5e-3).
// Needs n_in % 8 == 0 and n_pairs, n_expert within the context's bounds.
// x_quantized: the context's matmul_id rows hold x quantized (the previous matmul_id call had
// this same x and n_x_rows and returned true: gate then up; or a producer wrote them through
// matmul_id_q8). xq_given / xds_given: x quantized as quantize_q8_32 lays it out, elsewhere
// (e.g. matmul_q8's rows, which the norm before wrote), read instead of the context's rows.
// Returns whether x is held quantized afterwards (in the given rows, or else the context's).
bool matmul_id(MatmulContext* ctx, const Weight& stacked, int64_t n_expert, const float* x,
               int64_t n_x_rows, const int32_t* x_rows, const int32_t* ids, float* y,
               int64_t n_pairs, cudaStream_t s, bool x_quantized = false,
               const int8_t* xq_given = nullptr, const float2* xds_given = nullptr);
// Whether matmul_id takes its few-pair form (matvec_id on x quantized to int8) for these
// arguments: what the fused MoE decode kernels (moe_decode.cu) must match to give its bits.
bool matmul_id_few(const MatmulContext* ctx, const Weight& stacked, int64_t n_expert,
                   int64_t n_x_rows, int64_t n_pairs);
// The context's matmul_id int8 rows, for a producer (swiglu_q8) to write x [n_rows, n_in] into
// before a matmul_id call with x_quantized; nulls when the context has none or they hold fewer
// values.
MatmulQ8 matmul_id_q8(MatmulContext* ctx, int64_t n_rows, int64_t n_in);
// The deterministic mode (Backend::set_deterministic): from now on matmul, matmul_shared and
// matmul_id take one path per weight whatever the token count, so that y[t] is the same bits
// whatever n_tokens and the other tokens: Q4_K/Q5_K/Q6_K/Q8_0 on sm_90 through mmh with each
// weight's split count fixed by its shape (fp16 operands, as above); other types through the
// direct kernels in runs of 8 tokens (fp32); matmul_id through the direct kernels always.
// Nothing is read or left quantized to int8 (matmul_shared and matmul_id return false).
void matmul_set_deterministic(MatmulContext* ctx, bool on);

// ---- int8 matrix-vector products (matvec.cu) ------------------------------------------------

// The largest token count of the int8 matvec path.
constexpr int kMatvecMaxTokens = 8;
// Whether matvec_q8 takes w: Q4_0, Q8_0, Q4_K, Q5_K or Q6_K with whole blocks per row (and,
// for Q4_K/Q5_K, 16-byte aligned rows).
bool matvec_supports(const Weight& w);
// Per group of 32 values of x [n_tokens, n_in] (n_in % 32 == 0): xds = (max|x| / 127, sum x)
// and xq = round(x * 127 / max|x|) as int8.
void quantize_q8_32(const float* x, int64_t n_tokens, int64_t n_in, int8_t* xq, float2* xds,
                    cudaStream_t s);
// ys[i][t] = ws[i] x[t] for i < n_w <= 32 and t < n_tokens <= kMatvecMaxTokens, from x
// quantized by quantize_q8_32 (every ws[i] as wide as x), with int8 dot products (matvec.cu
// says how, and its precision: ~5e-3 of the output norm). Weights of one type go in one launch.
void matvec_q8(const Weight* const* ws, float* const* ys, int n_w, const int8_t* xq,
               const float2* xds, int64_t n_tokens, cudaStream_t s);
// Whether matvec_q8 streams the rows of 16-byte aligned weights through shared memory by bulk
// copies (matvec.cu, on sm_90+; bit for bit the per-warp kernel's result) or reads them with
// each warp's loads. KILN_CUDA_MATVEC_STREAM=1 / 0 sets it at start; tests flip it.
void matvec_set_stream(bool on);
bool matvec_stream();
// Whether matvec_q8 at one token launches weights of two groups, Q4_K or Q5_K and Q6_K (q/k and
// v of the _M mixtures), in one kernel (bit for bit the two launches' results).
// On unless KILN_CUDA_MATVEC_MIXED=0 at start; tests flip it. And its launches so far (for tests:
// that it ran).
void matvec_set_mixed(bool on);
bool matvec_mixed();
int64_t matvec_mixed_launched();
// matmul_id's few-pair form (decode): y[p] = W_{ids[p]} x[x_rows[p]] for p < n_pairs, stacked
// holding the experts' matrices back to back, x quantized by quantize_q8_32 (rows of n_in);
// each pair's result bit for bit matvec_q8 of its expert's matrix on its row. Pairs whose id
// is outside [0, n_expert) leave y untouched. False (nothing launched) for a type matvec_q8
// does not take.
bool matvec_id(const Weight& stacked, int64_t n_expert, const int8_t* xq, const float2* xds,
               const int32_t* x_rows, const int32_t* ids, float* y, int64_t n_pairs,
               cudaStream_t s);
// Two such matmuls in one launch (an MoE layer's gate and up experts on the same pairs): y from
// first, y2 from second, each bit for bit matvec_id's. False (nothing launched) unless both are
// of one type and shape that matvec_q8 takes.
bool matvec_id_pair(const Weight& first, const Weight& second, int64_t n_expert, const int8_t* xq,
                    const float2* xds, const int32_t* x_rows, const int32_t* ids, float* y,
                    float* y2, int64_t n_pairs, cudaStream_t s);
// The choices matvec_id makes, for the kernels that must give its bits (moe_decode.cu): whether
// Q4_K / Q5_K rows take the coalesced parts (KILN_CUDA_MATVEC_K_FORM), and how many lanes take
// a row of `stacked` (16: half a warp, for rows of at most 16 parts; KILN_CUDA_MATVEC_ID_HALF).
bool matvec_k_coalesced();
int matvec_id_lanes(const Weight& stacked);
// F16 / BF16 / F32 weights with 16-byte aligned rows (and x): ys[i][t] = ws[i] x[t] as above, one
// warp per row, fp32 arithmetic on the exact weights (~1e-5).
bool matvec_half_supports(const Weight& w, const float* x);
void matvec_half(const Weight* const* ws, float* const* ys, int n_w, const float* x,
                 int64_t n_tokens, cudaStream_t s);

// ---- paged KV cache and attention (attention.cu) -------------------------------------------

// One layer's paged KV storage on the device. Layout per block (the CUDA backend's own,
// defined here): for each kv head (head-major: one head's part of a block is contiguous),
//  - F32/F16: block_tokens rows of head_dim elements ([block][kv_head][token][dim]), so a
//    warp reading a key row reads consecutive 16-byte words;
//  - Q8_0: the same values as ggml's block_q8_0 rows, split into two arrays so the int8
//    levels stay 16-byte aligned: qs [token][head_dim] int8, then d [token][head_dim / 32]
//    f16 (a block_q8_0 is 34 bytes, which would leave the levels only 2-byte aligned). The
//    byte count equals block_tokens rows of head_dim / 32 block_q8_0.
// K and V alike (unlike cpu::KvLayerView, which stores F32/F16 K transposed).
struct KvLayer {
  quant::Type type = quant::Type::F16;  // F32, F16 or Q8_0
  uint8_t* k = nullptr;
  uint8_t* v = nullptr;
  int64_t k_block_bytes = 0;  // bytes of one block (all kv heads)
  int64_t v_block_bytes = 0;
  int32_t block_tokens = 16;
  int32_t n_kv_heads = 0;
  int32_t head_dim_k = 0;  // multiple of 8 (of 32 for Q8_0), at most 256
  int32_t head_dim_v = 0;
};
// Bytes of one block of one layer for K (or V: pass head_dim_v).
int64_t kv_block_bytes(quant::Type type, int32_t block_tokens, int32_t n_kv_heads,
                       int32_t head_dim);
// A KvLayer over device storage k, v with kv_block_bytes filled in.
KvLayer make_kv_layer(quant::Type type, uint8_t* k, uint8_t* v, int32_t block_tokens,
                      int32_t n_kv_heads, int32_t head_dim_k, int32_t head_dim_v);

struct AttnParams {
  int32_t n_heads = 0;
  float scale = 1.0f;
  float softcap = 0.0f;        // 0 = off
  int32_t sliding_window = 0;  // 0 = whole context
  // false: every key 0 .. kv_len - 1 of the row's sequence (backend::AttnParams::causal); not
  // with a sliding window.
  bool causal = true;
  // Device scratch for split-K decode (partial softmax states and split counters); null = no
  // split (one CTA per (token, kv head) walks the whole context). Size it with
  // attention_workspace_bytes and zero it once before the first use (the kernels leave the
  // counters zero).
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;
  // Optional: the decode kernel also writes out quantized as quantize_q8_32 would (int8
  // levels [n_tokens][n_heads * head_dim_v], one (d, d * level sum) per 32), for the matvec
  // that follows; attention() says whether it did (decode rows, head_dim_v % 32 == 0).
  int8_t* xq = nullptr;
  float2* xds = nullptr;
  // The deterministic mode (Backend::set_deterministic): every row, decode or prefill, on the
  // decode kernels with one split rule (a row's context cut by its own length alone), so that a
  // row's output is the same bits whatever the batch, the prompt's chunking or a prefix-cache
  // hit. Needs the workspace attention_workspace_bytes(.., true) sizes.
  bool deterministic = false;
};
// Scratch that lets attention() split long decode contexts over several CTAs (a fixed
// size: the split count shrinks as the token count grows; deterministic: room for the fixed
// split count over runs of rows).
int64_t attention_workspace_bytes(int32_t n_heads, int32_t head_dim_v, bool deterministic = false);

// b: the step's CSR metadata (AttnBatch) with every pointer in device memory; n_tokens the
// flat row count (qo_indptr[num_seqs]); max_q_len the longest query run of any sequence (host
// value, for the launch shape). Writes K/V rows [n_tokens, n_kv_heads, head_dim] at their
// positions, converted to the cache type (F16 round-to-nearest-even, Q8_0 as ggml).
void kv_write(const KvLayer& kv, const AttnBatch& b, int64_t n_tokens, const float* k,
              const float* v, cudaStream_t s);
// rope_apply2(q, n_heads_q, k, kv.n_kv_heads, ...) then kv_write(kv, b, n_tokens, k, v) in one
// launch (the same values, bit for bit): q and k rotated in place, k and v written to the cache.
// With q_norm and k_norm ([head_dim] each; only where rope_kv_write_norms_fuse says so), every
// head row of q and k is first rmsnorm'd with them (eps), bit for bit as rmsnorm on the rows
// [n_tokens * heads, head_dim].
void rope_kv_write(const KvLayer& kv, const AttnBatch& b, int64_t n_tokens, float* q,
                   int32_t n_heads_q, float* k, const float* v, int32_t n_pairs, bool neox,
                   const float* cos, const float* sin, cudaStream_t s,
                   const float* q_norm = nullptr, const float* k_norm = nullptr, float eps = 0.0f);
// Whether rope_kv_write can fuse these per-head norms (head_dim a multiple of 4 up to 512, q, k
// and both weights 16-byte aligned: rmsnorm's one-float4-per-thread path).
bool rope_kv_write_norms_fuse(const KvLayer& kv, const float* q, const float* k,
                              const float* q_norm, const float* k_norm);
// Paged attention (causal, or not: p.causal) with GQA, sliding window and softcap, as
// cpu::attention (fp32 math; within 1e-5 of max |V| of cpu::attention_reference on the same stored
// K/V). q [n_tokens, n_heads, head_dim_k], out [n_tokens, n_heads, head_dim_v], both 16-byte
// aligned. max_q_len <= 1 runs the decode kernel (split-K over the context when p.workspace
// is set), otherwise the tiled prefill kernel; either handles a mixed batch.
bool attention(const KvLayer& kv, const AttnBatch& b, int64_t n_tokens, int32_t max_q_len,
               const float* q, float* out, const AttnParams& p, cudaStream_t s);
// Reads token in_block of kv head kvh of `block` back as fp32 (host out), for tests.
void kv_read(const KvLayer& kv, bool is_k, int64_t block, int32_t in_block, int32_t kvh,
             float* host_out);

}  // namespace kiln::backend::cuda
