// The attention mixer of a layer: norm (with the previous block's residual add), q/k/v
// projections (fused for phi3, biased for qwen2, with an output gate per head for qwen35),
// per-head q/k norms (qwen3, gemma3), rope and the KV write, paged attention (sliding on the
// layers that slide; the cache's layer is hp.kv_layer), the gate, and the output projection. Its
// output is left in tmp_ for the FFN block to add.
#include <cmath>

#include "kiln/model/forward.h"

namespace kiln::model {

using backend::Mat;

void Forward::attention_block(int il, const LayerDesc& desc, const backend::StepArgs& step,
                              backend::KvCache& cache, int64_t n) {
  const HParams& hp = model_.hparams();
  const LayerWeights& l = layers_[il];
  const ArchFeatures& f = model_.arch().features;
  const int64_t q_width = int64_t{hp.n_head} * hp.head_dim_k;
  const int64_t k_width = int64_t{hp.n_head_kv} * hp.head_dim_k;
  const int64_t v_width = int64_t{hp.n_head_kv} * hp.head_dim_v;
  const Mat x = x_.first_rows(n), xn = xn_.as(n, hp.n_embd);
  const Mat q = q_.first_rows(n), k = k_.first_rows(n), v = v_.first_rows(n);
  if (residual_pending(il)) {  // the previous layer's FFN output: x += tmp, then norm
    be_.add_rmsnorm(x, tmp_.first_rows(n), l.attn_norm, xn, hp.rms_eps);
    dump("layer_out", il - 1, x);
  } else {
    be_.rmsnorm(x, l.attn_norm, xn, hp.rms_eps);
  }
  dump("attn_norm", il, xn);
  if (f.fused_qkv) {  // [n, q | k | v] -> q, k, v
    const Mat qkv = gate_.as(n, q_width + k_width + v_width);
    be_.matmul(l.wqkv, xn, qkv);
    be_.copy_cols(qkv, 0, q);
    be_.copy_cols(qkv, q_width, k);
    be_.copy_cols(qkv, q_width + k_width, v);
  } else if (f.attn_output_gate) {  // [q_h | gate_h] per head -> q, gates
    const Mat qg = q_gate_.first_rows(n);
    const backend::Weight* ws[] = {&l.wq, &l.wk, &l.wv};
    const Mat ys[] = {qg, k, v};
    be_.matmuls(ws, xn, ys);
    be_.deinterleave(qg, hp.head_dim_k, q, attn_gate_.first_rows(n));
  } else {
    const backend::Weight* ws[] = {&l.wq, &l.wk, &l.wv};
    const Mat ys[] = {q, k, v};
    be_.matmuls(ws, xn, ys);
  }
  if (f.qkv_bias) {
    be_.add_bias(q, l.bq);
    be_.add_bias(k, l.bk);
    be_.add_bias(v, l.bv);
  }
  const bool swa = desc.sliding;
  const int32_t kv_layer = static_cast<int32_t>(hp.kv_layer(static_cast<uint32_t>(il)) - kv_base_);
  const int table = swa && rope_swa_differs_ ? 1 : 0;
  const Mat cos = rope_cos_[table].first_rows(n), sin = rope_sin_[table].first_rows(n);
  backend::Backend::HeadNorms norms;  // per head, before rope
  if (f.qk_norm) norms = {l.q_norm, l.k_norm, hp.rms_eps};
  be_.rope_kv_write(q, static_cast<int32_t>(hp.n_head), k, static_cast<int32_t>(hp.n_head_kv),
                    static_cast<int32_t>(hp.head_dim_k), f.rope_neox, cos, sin, cache, kv_layer,
                    step, v, norms);
  if (step.row_scale != nullptr) be_.scale_rows(q, step.row_scale);
  dump("q", il, q);
  dump("k", il, k);
  dump("v", il, v);
  backend::AttnParams ap;
  ap.n_heads = static_cast<int32_t>(hp.n_head);
  ap.scale =
      hp.attn_scale != 0 ? hp.attn_scale : 1.0f / std::sqrt(static_cast<float>(hp.head_dim_k));
  ap.softcap = hp.attn_softcap;
  ap.sliding_window = swa ? static_cast<int32_t>(hp.sliding_window) : 0;
  const Mat attn = attn_.first_rows(n), tmp = tmp_.first_rows(n);
  be_.attention(cache, kv_layer, step, q, attn, ap);
  if (f.attn_output_gate) be_.sigmoid_mul(attn, attn_gate_.first_rows(n), attn);
  dump("attn_out", il, attn);
  be_.matmul(l.wo, attn, tmp);
  reduce(tmp);
  if (f.sandwich_norm) be_.rmsnorm(tmp, l.attn_post_norm, tmp, hp.rms_eps);
  // x += tmp is left to ffn_block, which fuses it with its norm.
}

}  // namespace kiln::model
