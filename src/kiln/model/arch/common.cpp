#include <fmt/format.h>

#include "kiln/model/arch/arch.h"

namespace kiln::model {

std::string blk(uint32_t layer, std::string_view suffix) {
  return fmt::format("blk.{}.{}", layer, suffix);
}

void add_embeddings(std::vector<TensorSpec>& out, const HParams& hp) {
  const int64_t d = hp.n_embd, v = hp.n_vocab;
  out.push_back({"token_embd.weight", {d, v}, TensorKind::kWeight, true});
  out.push_back({"output_norm.weight", {d}, TensorKind::kNorm, true});
  // Tied models omit output.weight and reuse token_embd.weight for the logits.
  out.push_back({"output.weight", {d, v}, TensorKind::kWeight, false});
}

void add_attention(std::vector<TensorSpec>& out, const HParams& hp, uint32_t i,
                   const ArchFeatures& f) {
  const int64_t d = hp.n_embd;
  const int64_t q = int64_t{hp.n_head} * hp.head_dim_k;
  const int64_t k = int64_t{hp.n_head_kv} * hp.head_dim_k;
  const int64_t v = int64_t{hp.n_head_kv} * hp.head_dim_v;
  out.push_back({blk(i, "attn_norm.weight"), {d}, TensorKind::kNorm, true});
  if (f.fused_qkv) {
    out.push_back({blk(i, "attn_qkv.weight"), {d, q + k + v}, TensorKind::kWeight, true});
  } else {
    out.push_back({blk(i, "attn_q.weight"), {d, q}, TensorKind::kWeight, true});
    out.push_back({blk(i, "attn_k.weight"), {d, k}, TensorKind::kWeight, true});
    out.push_back({blk(i, "attn_v.weight"), {d, v}, TensorKind::kWeight, true});
  }
  out.push_back({blk(i, "attn_output.weight"),
                 {int64_t{hp.n_head} * hp.head_dim_v, d},
                 TensorKind::kWeight,
                 true});
  if (f.sandwich_norm)
    out.push_back({blk(i, "post_attention_norm.weight"), {d}, TensorKind::kNorm, true});
  if (f.qkv_bias) {
    out.push_back({blk(i, "attn_q.bias"), {q}, TensorKind::kNorm, true});
    out.push_back({blk(i, "attn_k.bias"), {k}, TensorKind::kNorm, true});
    out.push_back({blk(i, "attn_v.bias"), {v}, TensorKind::kNorm, true});
  }
  if (f.qk_norm) {
    out.push_back({blk(i, "attn_q_norm.weight"), {hp.head_dim_k}, TensorKind::kNorm, true});
    out.push_back({blk(i, "attn_k_norm.weight"), {hp.head_dim_k}, TensorKind::kNorm, true});
  }
}

void add_dense_ffn(std::vector<TensorSpec>& out, const HParams& hp, uint32_t i,
                   const ArchFeatures& f) {
  const int64_t d = hp.n_embd, ff = hp.n_ff;
  out.push_back({blk(i, "ffn_norm.weight"), {d}, TensorKind::kNorm, true});
  if (f.fused_gate_up) {
    out.push_back({blk(i, "ffn_up.weight"), {d, 2 * ff}, TensorKind::kWeight, true});
  } else {
    out.push_back({blk(i, "ffn_gate.weight"), {d, ff}, TensorKind::kWeight, true});
    out.push_back({blk(i, "ffn_up.weight"), {d, ff}, TensorKind::kWeight, true});
  }
  out.push_back({blk(i, "ffn_down.weight"), {ff, d}, TensorKind::kWeight, true});
  if (f.sandwich_norm)
    out.push_back({blk(i, "post_ffw_norm.weight"), {d}, TensorKind::kNorm, true});
}

std::vector<TensorSpec> standard_manifest(const HParams& hp, const ArchFeatures& f) {
  std::vector<TensorSpec> out;
  add_embeddings(out, hp);
  for (uint32_t i = 0; i < hp.n_layer; ++i) {
    add_attention(out, hp, i, f);
    if (f.moe) {
      add_moe_ffn(out, hp, i);
    } else {
      add_dense_ffn(out, hp, i, f);
    }
  }
  return out;
}

void add_moe_ffn(std::vector<TensorSpec>& out, const HParams& hp, uint32_t i) {
  const int64_t d = hp.n_embd, ff = hp.n_ff_expert, e = hp.n_expert;
  out.push_back({blk(i, "ffn_norm.weight"), {d}, TensorKind::kNorm, true});
  out.push_back({blk(i, "ffn_gate_inp.weight"), {d, e}, TensorKind::kWeight, true});
  // Experts are stacked in one 3-D tensor per projection: [in, out, n_expert].
  out.push_back({blk(i, "ffn_gate_exps.weight"), {d, ff, e}, TensorKind::kWeight, true});
  out.push_back({blk(i, "ffn_up_exps.weight"), {d, ff, e}, TensorKind::kWeight, true});
  out.push_back({blk(i, "ffn_down_exps.weight"), {ff, d, e}, TensorKind::kWeight, true});
}

}  // namespace kiln::model
