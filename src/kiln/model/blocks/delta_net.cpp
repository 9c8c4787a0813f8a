// The Gated DeltaNet mixer of a hybrid layer (qwen35, qwen35moe, qwen3next): norm (with the
// previous block's residual add), the input projections (mixed [q | k | v], the output gate z,
// beta and alpha), the causal conv + SiLU over each sequence's rows with its conv state, the
// gated delta rule over its recurrent state (q and k L2-normalised per head inside the op),
// the gated RMSNorm per value head (rmsnorm(o) * w * silu(z)), and ssm_out. Its output is
// left in tmp_ for the FFN block to add.
#include "kiln/model/forward.h"

namespace kiln::model {

using backend::Mat;

void Forward::delta_net_block(int il, const backend::StepArgs& step, backend::StateCache& state,
                              int64_t n) {
  const HParams& hp = model_.hparams();
  const LayerWeights& l = layers_[il];
  const Mat x = x_.first_rows(n), xn = xn_.as(n, hp.n_embd);
  if (residual_pending(il)) {
    be_.add_rmsnorm(x, tmp_.first_rows(n), l.attn_norm, xn, hp.rms_eps);
    dump("layer_out", il - 1, x);
  } else {
    be_.rmsnorm(x, l.attn_norm, xn, hp.rms_eps);
  }
  dump("attn_norm", il, xn);
  const int64_t nv = hp.linear_n_v_heads, dv = hp.linear_head_v_dim;
  const Mat mixed = lin_mixed_.first_rows(n), conv = lin_conv_.first_rows(n);
  const Mat z = lin_z_.first_rows(n), core = lin_core_.first_rows(n);
  const Mat beta = lin_beta_.first_rows(n), alpha = lin_alpha_.first_rows(n);
  if (!l.w_ba.empty()) {  // qwen3next: [b | a] of each key head's group of value heads
    const Mat ba = lin_ba_.first_rows(n);
    const backend::Weight* ws[] = {&l.wqkv, &l.w_z, &l.w_ba};
    const Mat ys[] = {mixed, z, ba};
    be_.matmuls(ws, xn, ys);
    be_.deinterleave(ba, nv / hp.linear_n_k_heads, beta, alpha);
  } else {
    const backend::Weight* ws[] = {&l.wqkv, &l.w_z, &l.w_beta, &l.w_alpha};
    const Mat ys[] = {mixed, z, beta, alpha};
    be_.matmuls(ws, xn, ys);
  }
  const int32_t li =
      static_cast<int32_t>(hp.linear_index(static_cast<uint32_t>(il)) - linear_base_);
  be_.conv1d_silu(state, li, step, mixed, l.ssm_conv1d, conv);
  dump("conv_out", il, conv);
  backend::DeltaParams p;
  p.n_k_heads = static_cast<int32_t>(hp.linear_n_k_heads);
  p.n_v_heads = static_cast<int32_t>(nv);
  p.head_k_dim = static_cast<int32_t>(hp.linear_head_k_dim);
  p.head_v_dim = static_cast<int32_t>(dv);
  // qwen3next files keep HF's grouped value heads; qwen35's converter tiles them.
  p.tiled_heads = model_.arch().name != "qwen3next";
  be_.gated_delta_rule(state, li, step, conv, alpha, beta, l.ssm_a, l.ssm_dt_bias, core, p);
  dump("delta_out", il, core);
  const Mat heads = core.as(n * nv, dv);
  be_.rmsnorm(heads, l.ssm_norm, heads, hp.rms_eps);
  be_.swiglu(z, core, core);  // * silu(z)
  be_.matmul(l.ssm_out, core, tmp_.first_rows(n));
  reduce(tmp_.first_rows(n));
  // x += tmp is left to ffn_block, which fuses it with its norm.
}

}  // namespace kiln::model
