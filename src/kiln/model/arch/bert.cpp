// bert: BertModel encoders (BGE, all-MiniLM, e5), for embeddings. Learned absolute positions
// and token types added to the token embeddings, LayerNorm (with bias) after the embeddings and
// after each residual add (post-norm), biases on every projection, exact GELU, non-causal
// attention, no final norm and no output head (blocks/encoder.cpp).
#include <fmt/format.h>

#include "kiln/model/arch/bert_tensors.h"
#include "kiln/model/arch/registry.h"

namespace kiln::model {

std::vector<BertTensor> bert_tensors(const BertDims& d) {
  const int64_t e = d.n_embd, ff = d.n_ff;
  std::vector<BertTensor> out;
  using M = ModelWeights;
  using L = LayerWeights;
  auto add = [&](std::string name, std::vector<int64_t> ne, std::string hf, WeightField field) {
    const TensorKind kind = ne.size() == 1 ? TensorKind::kNorm : TensorKind::kWeight;
    out.push_back(
        {TensorSpec{std::move(name), std::move(ne), kind, true, -1, field}, std::move(hf)});
  };
  // ggml order: ne[0] is the row length (HF's last dimension).
  add("token_embd.weight", {e, d.n_vocab}, "embeddings.word_embeddings.weight", &M::tok_embd);
  add("token_types.weight", {e, d.n_token_types}, "embeddings.token_type_embeddings.weight",
      &M::token_types);
  add("position_embd.weight", {e, d.n_ctx_train}, "embeddings.position_embeddings.weight",
      &M::position_embd);
  add("token_embd_norm.weight", {e}, "embeddings.LayerNorm.weight", &M::tok_embd_norm);
  add("token_embd_norm.bias", {e}, "embeddings.LayerNorm.bias", &M::tok_embd_norm_b);
  struct Part {
    const char* gguf;
    const char* hf;
    bool ff_in;   // input width n_ff (ffn_down)
    bool ff_out;  // output width n_ff (ffn_up)
    backend::Weight L::*w;
    const float* L::*norm;  // the LayerNorm's weight (instead of w)
    const float* L::*bias;
  };
  static constexpr Part kParts[] = {
      {"attn_q", "attention.self.query", false, false, &L::wq, nullptr, &L::bq},
      {"attn_k", "attention.self.key", false, false, &L::wk, nullptr, &L::bk},
      {"attn_v", "attention.self.value", false, false, &L::wv, nullptr, &L::bv},
      {"attn_output", "attention.output.dense", false, false, &L::wo, nullptr, &L::bo},
      {"attn_output_norm", "attention.output.LayerNorm", false, false, nullptr, &L::attn_post_norm,
       &L::attn_post_norm_b},
      {"ffn_up", "intermediate.dense", false, true, &L::w_up, nullptr, &L::b_up},
      {"ffn_down", "output.dense", true, false, &L::w_down, nullptr, &L::b_down},
      {"layer_output_norm", "output.LayerNorm", false, false, nullptr, &L::ffn_post_norm,
       &L::ffn_post_norm_b},
  };
  for (uint32_t il = 0; il < d.n_layer; ++il) {
    for (const Part& p : kParts) {
      const std::string g = fmt::format("blk.{}.{}", il, p.gguf);
      const std::string h = fmt::format("encoder.layer.{}.{}", il, p.hf);
      const int64_t n_out = p.ff_out ? ff : e;
      if (p.w != nullptr) add(g + ".weight", {p.ff_in ? ff : e, n_out}, h + ".weight", p.w);
      if (p.norm != nullptr) add(g + ".weight", {e}, h + ".weight", p.norm);
      add(g + ".bias", {n_out}, h + ".bias", p.bias);
      out[out.size() - 1].spec.layer = static_cast<int32_t>(il);
      out[out.size() - 2].spec.layer = static_cast<int32_t>(il);
    }
  }
  return out;
}

std::vector<TensorSpec> bert_manifest(const BertDims& d) {
  std::vector<TensorSpec> out;
  for (BertTensor& t : bert_tensors(d)) out.push_back(std::move(t.spec));
  return out;
}

bool bert_tensor_always_f32(std::string_view gguf_name) {
  return gguf_name == "token_types.weight" || gguf_name == "position_embd.weight";
}

namespace {

std::vector<TensorSpec> manifest(const ArchDef&, const HParams& hp) {
  return bert_manifest(
      BertDims{hp.n_vocab, hp.n_embd, hp.n_layer, hp.n_ff, hp.n_ctx_train, hp.n_token_types});
}

LayerDesc layer(const HParams&, uint32_t) {
  return {Mixer::kEncoderAttention, FfnKind::kEncoder, false};
}

}  // namespace

const ArchDef kArchBert{"bert", ArchFeatures{.encoder = true}, manifest, {}, layer};

}  // namespace kiln::model
