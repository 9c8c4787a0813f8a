// qwen35: Qwen3.5 / Qwen3.6 dense, the hybrid family (qwen35moe and qwen3next share this
// manifest). Every full_attention_interval-th layer is full attention with an output gate
// (attn_q is twice the width: each head's query, then its gate), q/k RMSNorm and a partial
// neox rope; the others are Gated DeltaNet layers (a causal conv over [q | k | v], the gated
// delta rule over a recurrent state, a gated RMSNorm, ssm_out). The FFN's input norm is
// post_attention_norm. The last nextn_predict_layers blocks are multi-token-prediction layers:
// checked and described, not loaded (a later speculative decoding issue runs them).
//
// The converter (llama.cpp's and kiln's) stores -exp(A_log) as ssm_a, adds the 1 of the
// (1 + w) RMSNorms into the norm weights (the gated ssm_norm excepted), and for qwen35 and
// qwen35moe reorders the value heads from grouped to tiled (value head h reads key head
// h % n_k); qwen3next files keep them grouped (h / (n_v / n_k)).
#include "kiln/model/arch/arch.h"
#include "kiln/model/arch/registry.h"

namespace kiln::model {
namespace {

constexpr ArchFeatures kFeatures{
    .qk_norm = true, .rope_neox = true, .attn_output_gate = true, .linear_attention = true};
// qwen35moe and qwen3next: the same with routed experts beside a shared one.
constexpr ArchFeatures kMoeFeatures{.qk_norm = true,
                                    .moe = true,
                                    .rope_neox = true,
                                    .attn_output_gate = true,
                                    .shared_expert = true,
                                    .linear_attention = true};

// Tensors of a block checked for shape and type but not loaded (the MTP layers).
TensorSpec unbound(uint32_t il, std::string_view suffix, std::vector<int64_t> ne, TensorKind kind,
                   bool required = true) {
  return {blk(il, suffix), std::move(ne), kind, required, static_cast<int32_t>(il), {}};
}

void add_linear_attention(std::vector<TensorSpec>& out, const ArchDef& arch, const HParams& hp,
                          uint32_t i) {
  using L = LayerWeights;
  const int64_t d = hp.n_embd, nv = hp.linear_n_v_heads;
  const int64_t value_dim = nv * hp.linear_head_v_dim;
  out.push_back(layer_tensor(i, "attn_qkv.weight", {d, hp.linear_conv_dim()}, &L::wqkv));
  out.push_back(layer_tensor(i, "attn_gate.weight", {d, value_dim}, &L::w_z));
  if (arch.name == "qwen3next") {
    out.push_back(layer_tensor(i, "ssm_ba.weight", {d, 2 * nv}, &L::w_ba));
  } else {
    out.push_back(layer_tensor(i, "ssm_beta.weight", {d, nv}, &L::w_beta));
    out.push_back(layer_tensor(i, "ssm_alpha.weight", {d, nv}, &L::w_alpha));
  }
  out.push_back(layer_tensor(i, "ssm_conv1d.weight", {hp.linear_conv_kernel, hp.linear_conv_dim()},
                             &L::ssm_conv1d));
  out.push_back(layer_tensor(i, "ssm_dt.bias", {nv}, &L::ssm_dt_bias));
  out.push_back(layer_tensor(i, "ssm_a", {nv}, &L::ssm_a));
  out.push_back(layer_tensor(i, "ssm_norm.weight", {hp.linear_head_v_dim}, &L::ssm_norm));
  out.push_back(layer_tensor(i, "ssm_out.weight", {value_dim, d}, &L::ssm_out));
}

void add_ffn(std::vector<TensorSpec>& out, const HParams& hp, uint32_t i) {
  using L = LayerWeights;
  const int64_t d = hp.n_embd;
  if (hp.n_expert == 0) {
    out.push_back(layer_tensor(i, "ffn_gate.weight", {d, hp.n_ff}, &L::w_gate));
    out.push_back(layer_tensor(i, "ffn_up.weight", {d, hp.n_ff}, &L::w_up));
    out.push_back(layer_tensor(i, "ffn_down.weight", {hp.n_ff, d}, &L::w_down));
    return;
  }
  const int64_t ff = hp.n_ff_expert, e = hp.n_expert, fs = hp.n_ff_shared;
  out.push_back(layer_tensor(i, "ffn_gate_inp.weight", {d, e}, &L::w_gate_inp));
  out.push_back(layer_tensor(i, "ffn_gate_exps.weight", {d, ff, e}, &L::w_gate_exps));
  out.push_back(layer_tensor(i, "ffn_up_exps.weight", {d, ff, e}, &L::w_up_exps));
  out.push_back(layer_tensor(i, "ffn_down_exps.weight", {ff, d, e}, &L::w_down_exps));
  out.push_back(layer_tensor(i, "ffn_gate_inp_shexp.weight", {d}, &L::w_gate_inp_shexp));
  out.push_back(layer_tensor(i, "ffn_gate_shexp.weight", {d, fs}, &L::w_gate_shexp));
  out.push_back(layer_tensor(i, "ffn_up_shexp.weight", {d, fs}, &L::w_up_shexp));
  out.push_back(layer_tensor(i, "ffn_down_shexp.weight", {fs, d}, &L::w_down_shexp));
}

// A multi-token-prediction block: a full-attention block with the FFN of the model, and the
// projection of [embedding | hidden] that feeds it.
void add_nextn(std::vector<TensorSpec>& out, const HParams& hp, uint32_t i) {
  constexpr TensorKind W = TensorKind::kWeight, N = TensorKind::kNorm;
  const int64_t d = hp.n_embd, v = hp.n_vocab;
  std::vector<TensorSpec> block;
  add_attention(block, hp, i, kFeatures);
  block.push_back(unbound(i, "post_attention_norm.weight", {d}, N));
  add_ffn(block, hp, i);
  for (TensorSpec& t : block) t.field = {};
  out.insert(out.end(), block.begin(), block.end());
  out.push_back(unbound(i, "nextn.eh_proj.weight", {2 * d, d}, W));
  out.push_back(unbound(i, "nextn.enorm.weight", {d}, N));
  out.push_back(unbound(i, "nextn.hnorm.weight", {d}, N));
  out.push_back(unbound(i, "nextn.embed_tokens.weight", {d, v}, W, false));
  out.push_back(unbound(i, "nextn.shared_head_head.weight", {d, v}, W, false));
  out.push_back(unbound(i, "nextn.shared_head_norm.weight", {d}, N, false));
}

LayerDesc layer(const HParams& hp, uint32_t il) {
  LayerDesc d;
  d.mixer = il >= hp.n_main_layers() ? Mixer::kNextN
            : hp.linear_layer(il)    ? Mixer::kGatedDeltaNet
                                     : Mixer::kAttention;
  d.ffn = hp.n_expert > 0 ? FfnKind::kMoe : FfnKind::kDense;
  return d;
}

}  // namespace

std::vector<TensorSpec> qwen35_manifest(const ArchDef& arch, const HParams& hp) {
  using L = LayerWeights;
  std::vector<TensorSpec> out;
  add_embeddings(out, hp);
  for (uint32_t i = 0; i < hp.n_layer; ++i) {
    const LayerDesc desc = describe_layer(arch, hp, i);
    if (desc.mixer == Mixer::kNextN) {
      add_nextn(out, hp, i);
      continue;
    }
    if (desc.mixer == Mixer::kGatedDeltaNet) {
      out.push_back(layer_tensor(i, "attn_norm.weight", {hp.n_embd}, &L::attn_norm));
      add_linear_attention(out, arch, hp, i);
    } else {
      add_attention(out, hp, i, arch.features);
    }
    out.push_back(layer_tensor(i, "post_attention_norm.weight", {hp.n_embd}, &L::ffn_norm));
    add_ffn(out, hp, i);
  }
  return out;
}

const ArchDef kArchQwen35{"qwen35", kFeatures, qwen35_manifest, {}, layer};
const ArchDef kArchQwen35Moe{"qwen35moe", kMoeFeatures, qwen35_manifest, {}, layer};
const ArchDef kArchQwen3Next{"qwen3next", kMoeFeatures, qwen35_manifest, {}, layer};

}  // namespace kiln::model
