// nomic-bert: NomicBertModel encoders (nomic-embed-text-v1 and v1.5), for embeddings. BERT's
// post-norm layout (blocks/encoder.cpp) with three changes: rotary positions instead of a
// position table (rotate-half pairs over the whole head, rope.freq_base, applied to q and k),
// one fused q/k/v projection, and a SwiGLU FFN (up * silu(gate), then down); no biases on the
// projections, LayerNorm (with bias) after the embeddings and after each residual add, token
// type 0 added to every token, non-causal attention, mean pooling as shipped.
#include <fmt/format.h>

#include "kiln/model/arch/bert_tensors.h"
#include "kiln/model/arch/registry.h"

namespace kiln::model {

std::vector<BertTensor> nomic_bert_tensors(const NomicBertDims& d) {
  const int64_t e = d.n_embd, ff = d.n_ff;
  std::vector<BertTensor> out;
  using M = ModelWeights;
  using L = LayerWeights;
  auto add = [&](std::string name, std::vector<int64_t> ne, std::string hf, WeightField field,
                 int32_t layer = -1, bool required = true) {
    const TensorKind kind = ne.size() == 1 ? TensorKind::kNorm : TensorKind::kWeight;
    out.push_back(
        {TensorSpec{std::move(name), std::move(ne), kind, required, layer, field}, std::move(hf)});
  };
  // ggml order: ne[0] is the row length (HF's last dimension).
  add("token_embd.weight", {e, d.n_vocab}, "embeddings.word_embeddings.weight", &M::tok_embd);
  add("token_types.weight", {e, d.n_token_types}, "embeddings.token_type_embeddings.weight",
      &M::token_types);
  add("token_embd_norm.weight", {e}, "emb_ln.weight", &M::tok_embd_norm);
  add("token_embd_norm.bias", {e}, "emb_ln.bias", &M::tok_embd_norm_b);
  for (uint32_t il = 0; il < d.n_layer; ++il) {
    const auto g = [&](const char* s) { return fmt::format("blk.{}.{}", il, s); };
    const auto h = [&](const char* s) { return fmt::format("encoder.layers.{}.{}", il, s); };
    const int32_t l = static_cast<int32_t>(il);
    add(g("attn_qkv.weight"), {e, d.n_qkv}, h("attn.Wqkv.weight"), &L::wqkv, l);
    add(g("attn_output.weight"), {e, e}, h("attn.out_proj.weight"), &L::wo, l);
    add(g("attn_output.bias"), {e}, "", &L::bo, l, false);
    add(g("attn_output_norm.weight"), {e}, h("norm1.weight"), &L::attn_post_norm, l);
    add(g("attn_output_norm.bias"), {e}, h("norm1.bias"), &L::attn_post_norm_b, l);
    add(g("ffn_up.weight"), {e, ff}, h("mlp.fc11.weight"), &L::w_up, l);
    add(g("ffn_up.bias"), {ff}, "", &L::b_up, l, false);
    add(g("ffn_gate.weight"), {e, ff}, h("mlp.fc12.weight"), &L::w_gate, l);
    add(g("ffn_down.weight"), {ff, e}, h("mlp.fc2.weight"), &L::w_down, l);
    add(g("ffn_down.bias"), {e}, "", &L::b_down, l, false);
    add(g("layer_output_norm.weight"), {e}, h("norm2.weight"), &L::ffn_post_norm, l);
    add(g("layer_output_norm.bias"), {e}, h("norm2.bias"), &L::ffn_post_norm_b, l);
  }
  return out;
}

std::vector<TensorSpec> nomic_bert_manifest(const NomicBertDims& d) {
  std::vector<TensorSpec> out;
  for (BertTensor& t : nomic_bert_tensors(d)) out.push_back(std::move(t.spec));
  return out;
}

namespace {

std::vector<TensorSpec> manifest(const ArchDef&, const HParams& hp) {
  const uint32_t n_qkv = hp.n_head * hp.head_dim_k + hp.n_head_kv * (hp.head_dim_k + hp.head_dim_v);
  return nomic_bert_manifest(
      NomicBertDims{hp.n_vocab, hp.n_embd, hp.n_layer, hp.n_ff, hp.n_token_types, n_qkv});
}

LayerDesc layer(const HParams&, uint32_t) {
  return {Mixer::kEncoderAttention, FfnKind::kEncoder, false};
}

}  // namespace

// rope_neox: HF's rotate_half (rotary_emb_interleaved false), llama.cpp's LLAMA_ROPE_TYPE_NEOX.
const ArchDef kArchNomicBert{"nomic-bert",
                             ArchFeatures{.rope_neox = true, .fused_qkv = true, .encoder = true},
                             manifest,
                             {},
                             layer};

}  // namespace kiln::model
