// The feed-forward blocks of a layer: the mixer's residual added to x and the FFN norm, then a
// dense gated FFN (SwiGLU, GeGLU for gemma; phi3's fused gate|up) or routed experts (qwen3moe;
// with a gated shared expert for qwen35moe and qwen3next).
// The output is left in tmp_ for the next layer's mixer (or body()) to add.
#include "kiln/model/forward.h"

namespace kiln::model {

using backend::Mat;

// x += tmp (the mixer's output), then xn = norm(x) with the layer's FFN norm.
void Forward::ffn_input(int il, int64_t n) {
  const HParams& hp = model_.hparams();
  const Mat x = x_.first_rows(n), xn = xn_.as(n, hp.n_embd), tmp = tmp_.first_rows(n);
  be_.add_rmsnorm(x, tmp, layers_[il].ffn_norm, xn, hp.rms_eps);
  dump("attn_residual", il, x);
  dump("ffn_norm", il, xn);
}

void Forward::dense_ffn_block(int il, int64_t n) {
  ffn_input(il, n);
  const HParams& hp = model_.hparams();
  const LayerWeights& l = layers_[il];
  const ArchFeatures& f = model_.arch().features;
  const Mat xn = xn_.as(n, hp.n_embd), tmp = tmp_.first_rows(n);
  const int64_t ff = hp.n_ff;
  const Mat gate = gate_.as(n, ff), up = up_.first_rows(n);
  if (f.fused_gate_up) {  // ffn_up rows are [gate | up]
    const Mat both = tmp2_.first_rows(n);
    be_.matmul(l.w_up, xn, both);
    be_.copy_cols(both, 0, gate);
    be_.copy_cols(both, ff, up);
  } else {
    const backend::Weight* ws[] = {&l.w_gate, &l.w_up};
    const Mat ys[] = {gate, up};
    be_.matmuls(ws, xn, ys);
  }
  if (f.gelu) {
    be_.geglu(gate, up, gate);
  } else {
    be_.swiglu(gate, up, gate);
  }
  be_.matmul(l.w_down, gate, tmp);
  reduce(tmp);
  if (f.sandwich_norm) be_.rmsnorm(tmp, l.ffn_post_norm, tmp, hp.rms_eps);
  // x += tmp is left to the next layer's mixer (fused with its norm), or to body()
  // after the last layer.
}

void Forward::moe_ffn_block(int il, int64_t n) {
  ffn_input(il, n);
  const HParams& hp = model_.hparams();
  const LayerWeights& l = layers_[il];
  const Mat xn = xn_.as(n, hp.n_embd), tmp = tmp_.first_rows(n);
  backend::MoeWeights mw;
  mw.router = &l.w_gate_inp;
  mw.gate_exps = &l.w_gate_exps;
  mw.up_exps = &l.w_up_exps;
  mw.down_exps = &l.w_down_exps;
  mw.n_expert = static_cast<int32_t>(hp.n_expert);
  mw.n_expert_used = static_cast<int32_t>(hp.n_expert_used);
  mw.n_ff = hp.n_ff_expert;
  // An expert-parallel rank holds its share of whole experts.
  if (place_.mesh.ep) mw.first_expert = place_.tp_rank * static_cast<int32_t>(l.w_gate_exps.n_mats);
  be_.moe(mw, xn, tmp, moe_);
  dump("ffn_moe_logits", il, moe_.router.as(n, hp.n_expert));
  dump("ffn_moe_out", il, tmp);
  if (model_.arch().features.shared_expert) shared_expert(il, n);
  reduce(tmp);  // the experts' (and shared expert's) partial sums of this rank
}

// The shared expert (qwen35moe, qwen3next): a SwiGLU FFN on every token, added to tmp scaled
// by sigmoid(ffn_gate_inp_shexp . xn).
void Forward::shared_expert(int il, int64_t n) {
  const HParams& hp = model_.hparams();
  const LayerWeights& l = layers_[il];
  const Mat xn = xn_.as(n, hp.n_embd), tmp = tmp_.first_rows(n);
  const int64_t fs = hp.n_ff_shared;
  const Mat g = gate_.as(n, fs), u = up_.as(n, fs);
  const Mat sh = shexp_out_.first_rows(n), sg = shexp_gate_.first_rows(n);
  const backend::Weight* ws[] = {&l.w_gate_shexp, &l.w_up_shexp, &l.w_gate_inp_shexp};
  const Mat ys[] = {g, u, sg};
  be_.matmuls(ws, xn, ys);
  be_.swiglu(g, u, g);
  be_.matmul(l.w_down_shexp, g, sh);
  be_.add_gated_rows(tmp, sh, sg);
  dump("ffn_shexp_out", il, sh);
}

}  // namespace kiln::model
