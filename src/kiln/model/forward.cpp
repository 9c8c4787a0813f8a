#include "kiln/model/forward.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace kiln::model {
namespace cpu = backend::cpu;

Forward::Forward(const Model& model, int32_t max_tokens, util::ThreadPool* pool)
    : model_(model), max_tokens_(max_tokens), pool_(pool) {
  const HParams& hp = model.hparams();
  const size_t t = static_cast<size_t>(max_tokens);
  const size_t q_width = size_t{hp.n_head} * std::max(hp.head_dim_k, hp.head_dim_v);
  x_.resize(t * hp.n_embd);
  xn_.resize(t * std::max<size_t>(hp.n_embd, q_width));
  q_.resize(t * hp.n_head * hp.head_dim_k);
  k_.resize(t * hp.n_head_kv * hp.head_dim_k);
  v_.resize(t * hp.n_head_kv * hp.head_dim_v);
  attn_.resize(t * hp.n_head * hp.head_dim_v);
  // Fused projections (phi3) need room for [q | k | v] and [gate | up] rows.
  const size_t qkv =
      size_t{hp.n_head} * hp.head_dim_k + size_t{hp.n_head_kv} * (hp.head_dim_k + hp.head_dim_v);
  gate_.resize(t * std::max<size_t>(hp.n_ff, qkv));
  up_.resize(t * hp.n_ff);
  tmp2_.resize(model.arch().features.fused_gate_up ? t * 2 * hp.n_ff : 0);
  tmp_.resize(t * hp.n_embd);
  rope_[0] = rope_freqs(hp, false, model.rope_freqs());
  rope_[1] = rope_freqs(hp, true, model.rope_freqs());
  rope_swa_differs_ = hp.sliding_window > 0 && (rope_[1].inv_freq != rope_[0].inv_freq ||
                                                rope_[1].attn_factor != rope_[0].attn_factor);
  for (int i = 0; i < (rope_swa_differs_ ? 2 : 1); ++i) {
    rope_cos_[i].resize(t * (hp.n_rot / 2));
    rope_sin_[i].resize(t * (hp.n_rot / 2));
  }
  if (hp.n_expert > 0) {
    router_.resize(t * hp.n_expert);
    moe_in_.resize(t * hp.n_embd);
    moe_gate_.resize(t * hp.n_ff_expert);
    moe_up_.resize(t * hp.n_ff_expert);
    moe_out_.resize(t * hp.n_embd);
    moe_slots_.resize(t * hp.n_expert_used * hp.n_embd);
  }
}

void Forward::dump(std::string_view name, int layer, const float* data, int64_t rows,
                   int64_t cols) {
  if (dump_) dump_(name, layer, data, rows, cols);
}

void Forward::attention_block(int il, const StepInput& in, kv::KvCache& cache, int64_t n) {
  const HParams& hp = model_.hparams();
  const LayerWeights& l = model_.layers()[il];
  const ArchFeatures& f = model_.arch().features;
  const int64_t q_width = int64_t{hp.n_head} * hp.head_dim_k;
  const int64_t k_width = int64_t{hp.n_head_kv} * hp.head_dim_k;
  const int64_t v_width = int64_t{hp.n_head_kv} * hp.head_dim_v;
  cpu::rmsnorm(x_.data(), l.attn_norm, xn_.data(), n, hp.n_embd, hp.rms_eps);
  dump("attn_norm", il, xn_.data(), n, hp.n_embd);
  if (f.fused_qkv) {  // [n, q | k | v] -> q_, k_, v_
    cpu::matmul(l.wqkv, xn_.data(), gate_.data(), n, pool_);
    const int64_t w = q_width + k_width + v_width;
    for (int64_t t = 0; t < n; ++t) {
      const float* row = gate_.data() + t * w;
      std::copy_n(row, q_width, q_.data() + t * q_width);
      std::copy_n(row + q_width, k_width, k_.data() + t * k_width);
      std::copy_n(row + q_width + k_width, v_width, v_.data() + t * v_width);
    }
  } else {
    cpu::matmul(l.wq, xn_.data(), q_.data(), n, pool_);
    cpu::matmul(l.wk, xn_.data(), k_.data(), n, pool_);
    cpu::matmul(l.wv, xn_.data(), v_.data(), n, pool_);
  }
  if (f.qkv_bias) {
    cpu::add_bias(q_.data(), l.bq, n, q_width);
    cpu::add_bias(k_.data(), l.bk, n, k_width);
    cpu::add_bias(v_.data(), l.bv, n, v_width);
  }
  if (f.qk_norm) {  // per head, before rope
    cpu::rmsnorm(q_.data(), l.q_norm, q_.data(), n * hp.n_head, hp.head_dim_k, hp.rms_eps);
    cpu::rmsnorm(k_.data(), l.k_norm, k_.data(), n * hp.n_head_kv, hp.head_dim_k, hp.rms_eps);
  }
  const bool swa = hp.swa_layer(static_cast<uint32_t>(il));
  const int table = swa && rope_swa_differs_ ? 1 : 0;
  const int32_t n_pairs = static_cast<int32_t>(hp.n_rot / 2);
  cpu::rope_apply(q_.data(), n, static_cast<int32_t>(hp.n_head),
                  static_cast<int32_t>(hp.head_dim_k), n_pairs, f.rope_neox,
                  rope_cos_[table].data(), rope_sin_[table].data());
  cpu::rope_apply(k_.data(), n, static_cast<int32_t>(hp.n_head_kv),
                  static_cast<int32_t>(hp.head_dim_k), n_pairs, f.rope_neox,
                  rope_cos_[table].data(), rope_sin_[table].data());
  if (hp.attn_temp_scale != 0) {  // mistral3: Llama 4 temperature tuning of q past orig_ctx
    const double orig = hp.rope_orig_ctx != 0 ? hp.rope_orig_ctx : hp.n_ctx_train;
    for (int64_t t = 0; t < n; ++t) {
      const double pos = in.attn.positions[t];
      const float s =
          static_cast<float>(1.0 + hp.attn_temp_scale * std::log(1.0 + std::floor(pos / orig)));
      if (s != 1.0f) cpu::scale(q_.data() + t * q_width, s, q_width);
    }
  }
  dump("q", il, q_.data(), n, q_width);
  dump("k", il, k_.data(), n, k_width);
  dump("v", il, v_.data(), n, v_width);

  const cpu::KvLayerView view =
      cpu::make_kv_view(cache.type(), cache.k_block(il, 0), cache.v_block(il, 0), kv::kBlockTokens,
                        static_cast<int32_t>(hp.n_head_kv), static_cast<int32_t>(hp.head_dim_k),
                        static_cast<int32_t>(hp.head_dim_v));
  KILN_ASSERT(static_cast<uint64_t>(view.k_block_bytes) == cache.k_block_bytes() &&
              static_cast<uint64_t>(view.v_block_bytes) == cache.v_block_bytes());
  cpu::kv_write(view, in.attn, k_.data(), v_.data());
  cpu::AttnParams ap;
  ap.n_heads = static_cast<int32_t>(hp.n_head);
  ap.scale =
      hp.attn_scale != 0 ? hp.attn_scale : 1.0f / std::sqrt(static_cast<float>(hp.head_dim_k));
  ap.softcap = hp.attn_softcap;
  ap.sliding_window = swa ? static_cast<int32_t>(hp.sliding_window) : 0;
  cpu::attention(view, in.attn, q_.data(), attn_.data(), ap, pool_);
  dump("attn_out", il, attn_.data(), n, l.wo.n_in);
  cpu::matmul(l.wo, attn_.data(), tmp_.data(), n, pool_);
  if (f.sandwich_norm)
    cpu::rmsnorm(tmp_.data(), l.attn_post_norm, tmp_.data(), n, hp.n_embd, hp.rms_eps);
  cpu::add(x_.data(), tmp_.data(), n * hp.n_embd);
  dump("attn_residual", il, x_.data(), n, hp.n_embd);
}

// Mixture of experts (qwen3moe): softmax over the router logits, the top n_expert_used experts
// (ties to the lower index), weights renormalised to sum to 1 (norm_topk_prob), and each
// expert a SwiGLU FFN. Tokens are grouped per expert so each expert's weights are read once
// per step; a token's result does not depend on which other tokens share the step.
void Forward::moe_block(int il, int64_t n) {
  const HParams& hp = model_.hparams();
  const LayerWeights& l = model_.layers()[il];
  const int64_t n_exp = hp.n_expert, k = hp.n_expert_used, d = hp.n_embd;
  cpu::matmul(l.w_gate_inp, xn_.data(), router_.data(), n, pool_);
  dump("ffn_moe_logits", il, router_.data(), n, n_exp);
  // Per token: the chosen experts and their weights.
  std::vector<int32_t> chosen(static_cast<size_t>(n * k));
  std::vector<float> weights(static_cast<size_t>(n * k));
  std::vector<float> probs(static_cast<size_t>(n_exp));
  std::vector<int32_t> order(static_cast<size_t>(n_exp));
  for (int64_t t = 0; t < n; ++t) {
    const float* r = router_.data() + t * n_exp;
    const float mx = *std::max_element(r, r + n_exp);
    double sum = 0;
    for (int64_t e = 0; e < n_exp; ++e) sum += probs[e] = std::exp(r[e] - mx);
    for (int64_t e = 0; e < n_exp; ++e) probs[e] = static_cast<float>(probs[e] / sum);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
      return probs[a] != probs[b] ? probs[a] > probs[b] : a < b;
    });
    float wsum = 0;
    for (int64_t j = 0; j < k; ++j) wsum += probs[order[j]];
    for (int64_t j = 0; j < k; ++j) {
      chosen[t * k + j] = order[j];
      weights[t * k + j] = probs[order[j]] / wsum;
    }
  }
  std::fill(tmp_.begin(), tmp_.begin() + n * d, 0.0f);
  std::vector<int64_t> rows;  // (token, slot) pairs routed to the expert, as t * k + j
  for (int64_t e = 0; e < n_exp; ++e) {
    rows.clear();
    for (int64_t i = 0; i < n * k; ++i)
      if (chosen[i] == e) rows.push_back(i);
    if (rows.empty()) continue;
    const int64_t m = static_cast<int64_t>(rows.size());
    for (int64_t i = 0; i < m; ++i)
      std::copy_n(xn_.data() + (rows[i] / k) * d, d, moe_in_.data() + i * d);
    cpu::matmul(expert(l.w_gate_exps, e), moe_in_.data(), moe_gate_.data(), m, pool_);
    cpu::matmul(expert(l.w_up_exps, e), moe_in_.data(), moe_up_.data(), m, pool_);
    cpu::swiglu(moe_gate_.data(), moe_up_.data(), moe_gate_.data(), m * hp.n_ff_expert);
    cpu::matmul(expert(l.w_down_exps, e), moe_gate_.data(), moe_out_.data(), m, pool_);
    // Weighted outputs per (token, slot); tokens then add their experts in slot order, so
    // the sum order is fixed whatever the grouping.
    for (int64_t i = 0; i < m; ++i) {
      float* dst = moe_slots_.data() + rows[i] * d;
      const float w = weights[rows[i]];
      for (int64_t c = 0; c < d; ++c) dst[c] = w * moe_out_[i * d + c];
    }
  }
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < k; ++j)
      cpu::add(tmp_.data() + t * d, moe_slots_.data() + (t * k + j) * d, d);
  dump("ffn_moe_out", il, tmp_.data(), n, d);
  cpu::add(x_.data(), tmp_.data(), n * d);
  dump("layer_out", il, x_.data(), n, d);
}

void Forward::ffn_block(int il, int64_t n) {
  const HParams& hp = model_.hparams();
  const LayerWeights& l = model_.layers()[il];
  const ArchFeatures& f = model_.arch().features;
  cpu::rmsnorm(x_.data(), l.ffn_norm, xn_.data(), n, hp.n_embd, hp.rms_eps);
  dump("ffn_norm", il, xn_.data(), n, hp.n_embd);
  if (f.moe) return moe_block(il, n);
  const int64_t ff = hp.n_ff;
  if (f.fused_gate_up) {  // ffn_up rows are [gate | up]
    cpu::matmul(l.w_up, xn_.data(), tmp2_.data(), n, pool_);
    for (int64_t t = 0; t < n; ++t) {
      std::copy_n(tmp2_.data() + t * 2 * ff, ff, gate_.data() + t * ff);
      std::copy_n(tmp2_.data() + t * 2 * ff + ff, ff, up_.data() + t * ff);
    }
  } else {
    cpu::matmul(l.w_gate, xn_.data(), gate_.data(), n, pool_);
    cpu::matmul(l.w_up, xn_.data(), up_.data(), n, pool_);
  }
  if (f.gelu) {
    cpu::geglu(gate_.data(), up_.data(), gate_.data(), n * ff);
  } else {
    cpu::swiglu(gate_.data(), up_.data(), gate_.data(), n * ff);
  }
  cpu::matmul(l.w_down, gate_.data(), tmp_.data(), n, pool_);
  if (f.sandwich_norm)
    cpu::rmsnorm(tmp_.data(), l.ffn_post_norm, tmp_.data(), n, hp.n_embd, hp.rms_eps);
  cpu::add(x_.data(), tmp_.data(), n * hp.n_embd);
  dump("layer_out", il, x_.data(), n, hp.n_embd);
}

// The step's cos/sin tables, once for all layers (and the sliding layers' own when they differ).
void Forward::rope_step(const StepInput& in, int64_t n) {
  const int32_t n_pairs = static_cast<int32_t>(model_.hparams().n_rot / 2);
  for (int i = 0; i < (rope_swa_differs_ ? 2 : 1); ++i)
    cpu::rope_angles(rope_[i].inv_freq.data(), n_pairs, in.attn.positions, n, rope_[i].attn_factor,
                     rope_cos_[i].data(), rope_sin_[i].data());
}

Status Forward::run(const StepInput& in, kv::KvCache& cache, float* logits) {
  const HParams& hp = model_.hparams();
  const int64_t n = static_cast<int64_t>(in.tokens.size());
  if (n == 0) return {};
  if (n > max_tokens_) return err("forward: {} tokens exceed the step capacity {}", n, max_tokens_);
  for (int32_t tok : in.tokens) {
    if (tok < 0 || static_cast<uint32_t>(tok) >= hp.n_vocab)
      return err("forward: token id {} is outside the vocabulary (0..{})", tok, hp.n_vocab - 1);
  }
  cpu::embed(model_.tok_embd(), in.tokens.data(), n, x_.data());
  if (model_.arch().features.embed_scale)
    cpu::scale(x_.data(), std::sqrt(static_cast<float>(hp.n_embd)), n * hp.n_embd);
  dump("embed", -1, x_.data(), n, hp.n_embd);
  rope_step(in, n);
  for (int il = 0; il < static_cast<int>(hp.n_layer); ++il) {
    attention_block(il, in, cache, n);
    ffn_block(il, n);
  }
  // Final norm and logits only for the rows that need them.
  const int64_t n_out = static_cast<int64_t>(in.logit_rows.size());
  for (int64_t i = 0; i < n_out; ++i) {
    const int32_t r = in.logit_rows[static_cast<size_t>(i)];
    KILN_ASSERT(r >= 0 && r < n);
    cpu::rmsnorm(x_.data() + int64_t{r} * hp.n_embd, model_.output_norm(),
                 xn_.data() + i * hp.n_embd, 1, hp.n_embd, hp.rms_eps);
  }
  dump("output_norm", -1, xn_.data(), n_out, hp.n_embd);
  cpu::matmul(model_.output(), xn_.data(), logits, n_out, pool_);
  if (hp.final_softcap > 0) cpu::softcap(logits, hp.final_softcap, n_out * hp.n_vocab);
  return {};
}

}  // namespace kiln::model
