// The blocks of an encoder layer (bert): post-norm, x = LayerNorm(x + block(x)), with biases on
// every projection.
//   attention: q/k/v = x W + b over the whole sequence (non-causal: every token of a sequence
//              is in the step, Forward refuses otherwise), o = attn W_o + b,
//              x = LayerNorm(x + o; attn_output_norm)
//   ffn:       h = GELU(x W_up + b) (the erf form), f = h W_down + b,
//              x = LayerNorm(x + f; layer_output_norm)
// Unlike the pre-norm blocks, each leaves x complete (nothing in tmp_ for the next block).
#include <cmath>

#include "kiln/model/forward.h"

namespace kiln::model {

using backend::Mat;

void Forward::encoder_embeddings(const backend::StepArgs& step, int64_t n) {
  const HParams& hp = model_.hparams();
  const Mat x = x_.first_rows(n), tmp = tmp_.first_rows(n);
  be_.embed(weights_.tok_embd, step.tokens, x);
  // Absolute positions (0 at the sequence's first token) and token type 0 for every token.
  be_.embed(weights_.position_embd, step.attn.positions, tmp);
  be_.add(x, tmp);
  be_.add_bias(x, token_type0_);
  be_.layernorm(x, weights_.tok_embd_norm, weights_.tok_embd_norm_b, x, hp.norm_eps);
  dump("embed", -1, x);
}

void Forward::encoder_attention_block(int il, const backend::StepArgs& step,
                                      backend::KvCache& cache, int64_t n) {
  const HParams& hp = model_.hparams();
  const LayerWeights& l = layers_[il];
  const Mat x = x_.first_rows(n), q = q_.first_rows(n), k = k_.first_rows(n), v = v_.first_rows(n),
            attn = attn_.first_rows(n), tmp = tmp_.first_rows(n);
  const backend::Weight* ws[] = {&l.wq, &l.wk, &l.wv};
  const Mat ys[] = {q, k, v};
  be_.matmuls(ws, x, ys);
  be_.add_bias(q, l.bq);
  be_.add_bias(k, l.bk);
  be_.add_bias(v, l.bv);
  dump("q", il, q);
  dump("k", il, k);
  dump("v", il, v);
  be_.kv_write(cache, il, step, k, v);
  backend::AttnParams ap;
  ap.n_heads = static_cast<int32_t>(hp.n_head);
  ap.scale = 1.0f / std::sqrt(static_cast<float>(hp.head_dim_k));
  ap.causal = false;
  be_.attention(cache, il, step, q, attn, ap);
  dump("attn_out", il, attn);
  be_.matmul(l.wo, attn, tmp);
  be_.add_bias(tmp, l.bo);
  be_.add_layernorm(x, tmp, l.attn_post_norm, l.attn_post_norm_b, x, hp.norm_eps);
  dump("attn_residual", il, x);
}

void Forward::encoder_ffn_block(int il, int64_t n) {
  const HParams& hp = model_.hparams();
  const LayerWeights& l = layers_[il];
  const Mat x = x_.first_rows(n), up = up_.first_rows(n), tmp = tmp_.first_rows(n);
  be_.matmul(l.w_up, x, up);
  be_.add_bias(up, l.b_up);
  be_.gelu(up, up);
  be_.matmul(l.w_down, up, tmp);
  be_.add_bias(tmp, l.b_down);
  be_.add_layernorm(x, tmp, l.ffn_post_norm, l.ffn_post_norm_b, x, hp.norm_eps);
  dump("layer_out", il, x);
}

}  // namespace kiln::model
