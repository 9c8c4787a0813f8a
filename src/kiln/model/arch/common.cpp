#include <fmt/format.h>

#include "kiln/model/arch/arch.h"

namespace kiln::model {

std::string blk(uint32_t layer, std::string_view suffix) {
  return fmt::format("blk.{}.{}", layer, suffix);
}

std::vector<TensorSpec> tensor_manifest(const ArchDef& arch, const HParams& hp) {
  return arch.manifest(arch, hp);
}

LayerDesc describe_layer(const ArchDef& arch, const HParams& hp, uint32_t il) {
  if (arch.layer != nullptr) return arch.layer(hp, il);
  LayerDesc d;
  d.ffn = arch.features.moe ? FfnKind::kMoe : FfnKind::kDense;
  d.sliding = hp.swa_layer(il);
  return d;
}

TensorSpec layer_tensor(uint32_t il, std::string_view suffix, std::vector<int64_t> ne,
                        backend::Weight LayerWeights::*field, bool required) {
  return {blk(il, suffix),          std::move(ne), TensorKind::kWeight, required,
          static_cast<int32_t>(il), field};
}

TensorSpec layer_tensor(uint32_t il, std::string_view suffix, std::vector<int64_t> ne,
                        const float* LayerWeights::*field, bool required) {
  return {blk(il, suffix),          std::move(ne), TensorKind::kNorm, required,
          static_cast<int32_t>(il), field};
}

void add_embeddings(std::vector<TensorSpec>& out, const HParams& hp) {
  const int64_t d = hp.n_embd, v = hp.n_vocab;
  out.push_back(
      {"token_embd.weight", {d, v}, TensorKind::kWeight, true, -1, &ModelWeights::tok_embd});
  out.push_back(
      {"output_norm.weight", {d}, TensorKind::kNorm, true, -1, &ModelWeights::output_norm});
  // Tied models omit output.weight and reuse token_embd.weight for the logits.
  out.push_back({"output.weight", {d, v}, TensorKind::kWeight, false, -1, &ModelWeights::output});
}

void add_attention(std::vector<TensorSpec>& out, const HParams& hp, uint32_t i,
                   const ArchFeatures& f) {
  using L = LayerWeights;
  const int64_t d = hp.n_embd;
  const int64_t q = int64_t{hp.n_head} * hp.head_dim_k;
  const int64_t k = int64_t{hp.n_head_kv} * hp.head_dim_k;
  const int64_t v = int64_t{hp.n_head_kv} * hp.head_dim_v;
  out.push_back(layer_tensor(i, "attn_norm.weight", {d}, &L::attn_norm));
  if (f.fused_qkv) {
    out.push_back(layer_tensor(i, "attn_qkv.weight", {d, q + k + v}, &L::wqkv));
  } else {
    // qwen35: each head's query followed by its output gate.
    out.push_back(layer_tensor(i, "attn_q.weight", {d, f.attn_output_gate ? 2 * q : q}, &L::wq));
    out.push_back(layer_tensor(i, "attn_k.weight", {d, k}, &L::wk));
    out.push_back(layer_tensor(i, "attn_v.weight", {d, v}, &L::wv));
  }
  out.push_back(
      layer_tensor(i, "attn_output.weight", {int64_t{hp.n_head} * hp.head_dim_v, d}, &L::wo));
  if (f.sandwich_norm)
    out.push_back(layer_tensor(i, "post_attention_norm.weight", {d}, &L::attn_post_norm));
  if (f.qkv_bias) {
    out.push_back(layer_tensor(i, "attn_q.bias", {q}, &L::bq));
    out.push_back(layer_tensor(i, "attn_k.bias", {k}, &L::bk));
    out.push_back(layer_tensor(i, "attn_v.bias", {v}, &L::bv));
  }
  if (f.qk_norm) {
    out.push_back(layer_tensor(i, "attn_q_norm.weight", {hp.head_dim_k}, &L::q_norm));
    out.push_back(layer_tensor(i, "attn_k_norm.weight", {hp.head_dim_k}, &L::k_norm));
  }
}

void add_dense_ffn(std::vector<TensorSpec>& out, const HParams& hp, uint32_t i,
                   const ArchFeatures& f) {
  using L = LayerWeights;
  const int64_t d = hp.n_embd, ff = hp.n_ff;
  out.push_back(layer_tensor(i, "ffn_norm.weight", {d}, &L::ffn_norm));
  if (f.fused_gate_up) {
    out.push_back(layer_tensor(i, "ffn_up.weight", {d, 2 * ff}, &L::w_up));
  } else {
    out.push_back(layer_tensor(i, "ffn_gate.weight", {d, ff}, &L::w_gate));
    out.push_back(layer_tensor(i, "ffn_up.weight", {d, ff}, &L::w_up));
  }
  out.push_back(layer_tensor(i, "ffn_down.weight", {ff, d}, &L::w_down));
  if (f.sandwich_norm)
    out.push_back(layer_tensor(i, "post_ffw_norm.weight", {d}, &L::ffn_post_norm));
}

void add_moe_ffn(std::vector<TensorSpec>& out, const HParams& hp, uint32_t i) {
  using L = LayerWeights;
  const int64_t d = hp.n_embd, ff = hp.n_ff_expert, e = hp.n_expert;
  out.push_back(layer_tensor(i, "ffn_norm.weight", {d}, &L::ffn_norm));
  out.push_back(layer_tensor(i, "ffn_gate_inp.weight", {d, e}, &L::w_gate_inp));
  // Experts are stacked in one 3-D tensor per projection: [in, out, n_expert].
  out.push_back(layer_tensor(i, "ffn_gate_exps.weight", {d, ff, e}, &L::w_gate_exps));
  out.push_back(layer_tensor(i, "ffn_up_exps.weight", {d, ff, e}, &L::w_up_exps));
  out.push_back(layer_tensor(i, "ffn_down_exps.weight", {ff, d, e}, &L::w_down_exps));
}

std::vector<TensorSpec> standard_manifest(const ArchDef& arch, const HParams& hp) {
  std::vector<TensorSpec> out;
  add_embeddings(out, hp);
  for (uint32_t i = 0; i < hp.n_layer; ++i) {
    const LayerDesc d = describe_layer(arch, hp, i);
    if (d.mixer == Mixer::kAttention) add_attention(out, hp, i, arch.features);
    if (d.ffn == FfnKind::kDense) add_dense_ffn(out, hp, i, arch.features);
    if (d.ffn == FfnKind::kMoe) add_moe_ffn(out, hp, i);
  }
  return out;
}

}  // namespace kiln::model
