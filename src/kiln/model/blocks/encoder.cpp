// The blocks of an encoder layer (bert, nomic-bert): post-norm, x = LayerNorm(x + block(x)).
//   attention: q/k/v = x W + b over the whole sequence (non-causal: every token of a sequence
//              is in the step, Forward refuses otherwise), o = attn W_o + b,
//              x = LayerNorm(x + o; attn_output_norm)
//   ffn:       bert: h = GELU(x W_up + b) (the erf form); nomic-bert (a gate weight):
//              h = (x W_up) * silu(x W_gate); then f = h W_down + b,
//              x = LayerNorm(x + f; layer_output_norm)
// Positions: bert adds a learned position table to the embeddings; an encoder without one
// (nomic-bert) rotates q and k instead (rope over the head, the architecture's pairing).
// q/k/v come from one fused [q | k | v] projection where the file has one (nomic-bert). A bias
// the file does not have is not added (nomic-bert has none).
// Unlike the pre-norm blocks, each leaves x complete (nothing in tmp_ for the next block).
#include <cmath>

#include "kiln/model/forward.h"

namespace kiln::model {

using backend::Mat;

void Forward::encoder_embeddings(const backend::StepArgs& step, int64_t n) {
  const HParams& hp = model_.hparams();
  const Mat x = x_.first_rows(n), tmp = tmp_.first_rows(n);
  be_.embed(weights_.tok_embd, step.tokens, x);
  if (!weights_.position_embd.empty()) {  // absolute positions (0 at the sequence's first token)
    be_.embed(weights_.position_embd, step.attn.positions, tmp);
    be_.add(x, tmp);
  }
  if (token_type0_ != nullptr) be_.add_bias(x, token_type0_);  // token type 0 for every token
  be_.layernorm(x, weights_.tok_embd_norm, weights_.tok_embd_norm_b, x, hp.norm_eps);
  dump("embed", -1, x);
}

void Forward::encoder_attention_block(int il, const backend::StepArgs& step,
                                      backend::KvCache& cache, int64_t n) {
  const HParams& hp = model_.hparams();
  const LayerWeights& l = layers_[il];
  const Mat x = x_.first_rows(n), q = q_.first_rows(n), k = k_.first_rows(n), v = v_.first_rows(n),
            attn = attn_.first_rows(n), tmp = tmp_.first_rows(n);
  if (!l.wqkv.empty()) {  // [n, q | k | v] -> q, k, v
    const Mat qkv = gate_.as(n, q.cols + k.cols + v.cols);
    be_.matmul(l.wqkv, x, qkv);
    be_.copy_cols(qkv, 0, q);
    be_.copy_cols(qkv, q.cols, k);
    be_.copy_cols(qkv, q.cols + k.cols, v);
  } else {
    const backend::Weight* ws[] = {&l.wq, &l.wk, &l.wv};
    const Mat ys[] = {q, k, v};
    be_.matmuls(ws, x, ys);
  }
  if (l.bq != nullptr) be_.add_bias(q, l.bq);
  const int32_t kv_layer = il - static_cast<int32_t>(kv_base_);
  if (l.bk != nullptr) be_.add_bias(k, l.bk);
  if (l.bv != nullptr) be_.add_bias(v, l.bv);
  if (weights_.position_embd.empty()) {  // rotary positions
    be_.rope_kv_write(q, static_cast<int32_t>(hp.n_head), k, static_cast<int32_t>(hp.n_head_kv),
                      static_cast<int32_t>(hp.head_dim_k), model_.arch().features.rope_neox,
                      rope_cos_[0].first_rows(n), rope_sin_[0].first_rows(n), cache, kv_layer, step,
                      v, {});
  } else {
    be_.kv_write(cache, kv_layer, step, k, v);
  }
  dump("q", il, q);
  dump("k", il, k);
  dump("v", il, v);
  backend::AttnParams ap;
  ap.n_heads = static_cast<int32_t>(hp.n_head);
  ap.scale = 1.0f / std::sqrt(static_cast<float>(hp.head_dim_k));
  ap.causal = false;
  be_.attention(cache, kv_layer, step, q, attn, ap);
  dump("attn_out", il, attn);
  be_.matmul(l.wo, attn, tmp);
  reduce(tmp);
  if (l.bo != nullptr) be_.add_bias(tmp, l.bo);
  be_.add_layernorm(x, tmp, l.attn_post_norm, l.attn_post_norm_b, x, hp.norm_eps);
  dump("attn_residual", il, x);
}

void Forward::encoder_ffn_block(int il, int64_t n) {
  const HParams& hp = model_.hparams();
  const LayerWeights& l = layers_[il];
  const Mat x = x_.first_rows(n), up = up_.first_rows(n), tmp = tmp_.first_rows(n);
  be_.matmul(l.w_up, x, up);
  if (l.b_up != nullptr) be_.add_bias(up, l.b_up);
  Mat h = up;               // [n, n_ff]
  if (!l.w_gate.empty()) {  // SwiGLU: silu(gate) * up
    h = gate_.as(n, up.cols);
    be_.matmul(l.w_gate, x, h);
    be_.swiglu(h, up, h);
  } else {
    be_.gelu(up, up);
  }
  be_.matmul(l.w_down, h, tmp);
  reduce(tmp);
  if (l.b_down != nullptr) be_.add_bias(tmp, l.b_down);
  be_.add_layernorm(x, tmp, l.ffn_post_norm, l.ffn_post_norm_b, x, hp.norm_eps);
  dump("layer_out", il, x);
}

}  // namespace kiln::model
