// The weights of a loaded model as the forward uses them: matmul weights as views of the file
// (backend::Weight), norm and bias vectors as F32 copies. Which tensor goes into which field is
// written once, in each architecture's manifest (arch/arch.h, TensorSpec::field).
#pragma once

#include "kiln/backend/weight.h"

namespace kiln::model {

struct LayerWeights {
  const float* attn_norm = nullptr;  // [n_embd]
  backend::Weight wq, wk, wv, wo;
  backend::Weight wqkv;       // phi3: fused [q | k | v] rows (then wq/wk/wv are empty)
  const float* bq = nullptr;  // qkv biases (qwen2)
  const float* bk = nullptr;
  const float* bv = nullptr;
  const float* q_norm = nullptr;  // [head_dim] (qwen3)
  const float* k_norm = nullptr;
  const float* attn_post_norm = nullptr;  // gemma: after attention, before the residual add
  const float* ffn_norm = nullptr;
  const float* ffn_post_norm = nullptr;  // gemma: after the FFN, before the residual add
  backend::Weight w_gate, w_up, w_down;  // phi3: w_up holds [gate | up] rows, w_gate empty
  // Encoders (bert): biases of the output and FFN projections, and the LayerNorm biases of the
  // post-norms (attn_post_norm after attention, ffn_post_norm after the FFN).
  const float* bo = nullptr;
  const float* b_up = nullptr;
  const float* b_down = nullptr;
  const float* attn_post_norm_b = nullptr;
  const float* ffn_post_norm_b = nullptr;
  // MoE (qwen3moe): router [n_embd -> n_expert] and the stacked experts; expert e of a stacked
  // weight is expert(w, e).
  backend::Weight w_gate_inp, w_gate_exps, w_up_exps, w_down_exps;
  // The shared expert (qwen35moe, qwen3next) and its gate (a [n_embd] row: n_out 1).
  backend::Weight w_gate_shexp, w_up_shexp, w_down_shexp, w_gate_inp_shexp;
  // Gated DeltaNet (qwen35, qwen3next): wqkv is the conv's input projection [q | k | v]; the
  // output gate z, beta and alpha projections (qwen3next: [b | a] of each key head's group in
  // one w_ba), the conv taps [conv_dim, conv_kernel], dt bias and -exp(A_log) per value head,
  // the gated RMSNorm [head_v_dim] and the output projection.
  backend::Weight w_z, w_beta, w_alpha, w_ba, ssm_out;
  const float* ssm_conv1d = nullptr;
  const float* ssm_dt_bias = nullptr;
  const float* ssm_a = nullptr;
  const float* ssm_norm = nullptr;
};

// The weights outside the layers.
struct ModelWeights {
  backend::Weight tok_embd;
  backend::Weight output;  // tok_embd when the embeddings are tied
  const float* output_norm = nullptr;
  const float* rope_freqs = nullptr;  // null unless llama 3 rope scaling
  // Encoders (bert): absolute position and token type tables ([n_embd, n] rows to gather),
  // and the LayerNorm of the embeddings.
  backend::Weight position_embd, token_types;
  const float* tok_embd_norm = nullptr;
  const float* tok_embd_norm_b = nullptr;
};

}  // namespace kiln::model
