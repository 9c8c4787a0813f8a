#include "kiln/model/arch/bert_tensors.h"

#include <fmt/format.h>

namespace kiln::model {

std::vector<BertTensor> bert_tensors(const BertDims& d) {
  const int64_t e = d.n_embd, ff = d.n_ff;
  std::vector<BertTensor> out;
  auto add = [&](std::string name, std::vector<int64_t> ne, std::string hf) {
    const TensorKind kind = ne.size() == 1 ? TensorKind::kNorm : TensorKind::kWeight;
    out.push_back({TensorSpec{std::move(name), std::move(ne), kind, true}, std::move(hf)});
  };
  // ggml order: ne[0] is the row length (HF's last dimension).
  add("token_embd.weight", {e, d.n_vocab}, "embeddings.word_embeddings.weight");
  add("token_types.weight", {e, d.n_token_types}, "embeddings.token_type_embeddings.weight");
  add("position_embd.weight", {e, d.n_ctx_train}, "embeddings.position_embeddings.weight");
  add("token_embd_norm.weight", {e}, "embeddings.LayerNorm.weight");
  add("token_embd_norm.bias", {e}, "embeddings.LayerNorm.bias");
  struct Part {
    const char* gguf;
    const char* hf;
    bool ff_in;   // input width n_ff (ffn_down)
    bool ff_out;  // output width n_ff (ffn_up)
  };
  static constexpr Part kParts[] = {
      {"attn_q", "attention.self.query", false, false},
      {"attn_k", "attention.self.key", false, false},
      {"attn_v", "attention.self.value", false, false},
      {"attn_output", "attention.output.dense", false, false},
      {"attn_output_norm", "attention.output.LayerNorm", false, false},
      {"ffn_up", "intermediate.dense", false, true},
      {"ffn_down", "output.dense", true, false},
      {"layer_output_norm", "output.LayerNorm", false, false},
  };
  for (uint32_t il = 0; il < d.n_layer; ++il) {
    for (const Part& p : kParts) {
      const std::string g = fmt::format("blk.{}.{}", il, p.gguf);
      const std::string h = fmt::format("encoder.layer.{}.{}", il, p.hf);
      const bool norm = std::string_view(p.gguf).ends_with("_norm");
      const int64_t n_out = p.ff_out ? ff : e;
      if (!norm) add(g + ".weight", {p.ff_in ? ff : e, n_out}, h + ".weight");
      if (norm) add(g + ".weight", {e}, h + ".weight");
      add(g + ".bias", {n_out}, h + ".bias");
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

}  // namespace kiln::model
