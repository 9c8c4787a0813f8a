#include "kiln/model/model.h"

#include "kiln/model/hparams.h"
#include "kiln/quant/convert.h"

namespace kiln::model {

backend::KvSpec kv_spec(const HParams& hp, quant::Type type) {
  backend::KvSpec s;
  s.n_layer = static_cast<int32_t>(hp.n_layer);
  s.n_kv_heads = static_cast<int32_t>(hp.n_head_kv);
  s.head_dim_k = static_cast<int32_t>(hp.head_dim_k);
  s.head_dim_v = static_cast<int32_t>(hp.head_dim_v);
  s.type = type;
  s.block_tokens = kv::kBlockTokens;
  return s;
}

Expected<std::unique_ptr<Model>> Model::load(const std::string& path) {
  KILN_TRY(std::unique_ptr<gguf::File> file, gguf::File::open(path));
  return from_file(std::move(file));
}

Expected<backend::Weight> Model::weight(const std::string& name) const {
  const gguf::TensorInfo* t = file_->find_tensor(name);
  if (t == nullptr) return err("model: missing tensor '{}'", name);
  if (t->ne.size() < 2) return err("model: tensor '{}' is not a matrix", name);
  backend::Weight w;
  w.type = t->type;
  w.n_in = t->ne[0];
  w.n_out = t->ne[1];
  w.n_mats = t->ne.size() > 2 ? t->ne[2] : 1;
  w.data = t->data;
  w.row_bytes = *quant::row_bytes(t->type, static_cast<uint64_t>(t->ne[0]));
  return w;
}

Expected<const float*> Model::vector(const std::string& name, bool required) {
  const gguf::TensorInfo* t = file_->find_tensor(name);
  if (t == nullptr) {
    if (required) return err("model: missing tensor '{}'", name);
    return static_cast<const float*>(nullptr);
  }
  std::vector<float> v(static_cast<size_t>(t->num_elements()));
  KILN_TRY_STATUS(quant::dequantize_row(t->type, t->data, v.data(), t->num_elements()));
  f32_vectors_.push_back(std::move(v));
  return static_cast<const float*>(f32_vectors_.back().data());
}

Expected<std::unique_ptr<Model>> Model::from_file(std::unique_ptr<gguf::File> file) {
  std::unique_ptr<Model> m(new Model());
  m->file_ = std::move(file);
  KILN_TRY(m->hp_, read_hparams(*m->file_));
  m->arch_ = find_arch(m->hp_.arch);
  KILN_TRY_STATUS(check_manifest(*m->file_, *m->arch_, m->hp_));
  const ArchFeatures& f = m->arch_->features;
  KILN_TRY(m->tok_embd_, m->weight("token_embd.weight"));
  if (m->hp_.tied_embeddings) {
    m->output_ = m->tok_embd_;
  } else {
    KILN_TRY(m->output_, m->weight("output.weight"));
  }
  KILN_TRY(m->output_norm_, m->vector("output_norm.weight", true));
  KILN_TRY(m->rope_freqs_, m->vector("rope_freqs.weight", false));
  m->layers_.resize(m->hp_.n_layer);
  for (uint32_t i = 0; i < m->hp_.n_layer; ++i) {
    LayerWeights& l = m->layers_[i];
    KILN_TRY(l.attn_norm, m->vector(blk(i, "attn_norm.weight"), true));
    if (f.fused_qkv) {
      KILN_TRY(l.wqkv, m->weight(blk(i, "attn_qkv.weight")));
    } else {
      KILN_TRY(l.wq, m->weight(blk(i, "attn_q.weight")));
      KILN_TRY(l.wk, m->weight(blk(i, "attn_k.weight")));
      KILN_TRY(l.wv, m->weight(blk(i, "attn_v.weight")));
    }
    KILN_TRY(l.attn_post_norm, m->vector(blk(i, "post_attention_norm.weight"), f.sandwich_norm));
    KILN_TRY(l.ffn_post_norm, m->vector(blk(i, "post_ffw_norm.weight"), f.sandwich_norm));
    KILN_TRY(l.wo, m->weight(blk(i, "attn_output.weight")));
    KILN_TRY(l.bq, m->vector(blk(i, "attn_q.bias"), f.qkv_bias));
    KILN_TRY(l.bk, m->vector(blk(i, "attn_k.bias"), f.qkv_bias));
    KILN_TRY(l.bv, m->vector(blk(i, "attn_v.bias"), f.qkv_bias));
    KILN_TRY(l.q_norm, m->vector(blk(i, "attn_q_norm.weight"), f.qk_norm));
    KILN_TRY(l.k_norm, m->vector(blk(i, "attn_k_norm.weight"), f.qk_norm));
    KILN_TRY(l.ffn_norm, m->vector(blk(i, "ffn_norm.weight"), true));
    if (f.moe) {
      KILN_TRY(l.w_gate_inp, m->weight(blk(i, "ffn_gate_inp.weight")));
      KILN_TRY(l.w_gate_exps, m->weight(blk(i, "ffn_gate_exps.weight")));
      KILN_TRY(l.w_up_exps, m->weight(blk(i, "ffn_up_exps.weight")));
      KILN_TRY(l.w_down_exps, m->weight(blk(i, "ffn_down_exps.weight")));
      continue;
    }
    if (!f.fused_gate_up) {
      KILN_TRY(l.w_gate, m->weight(blk(i, "ffn_gate.weight")));
    }
    KILN_TRY(l.w_up, m->weight(blk(i, "ffn_up.weight")));
    KILN_TRY(l.w_down, m->weight(blk(i, "ffn_down.weight")));
  }
  return m;
}

uint64_t Model::weight_bytes_per_token() const {
  uint64_t total = 0;
  for (const gguf::TensorInfo& t : file_->tensors()) {
    if (t.name == "token_embd.weight" && !hp_.tied_embeddings) continue;
    // A token reads only the experts it is routed to.
    if (t.name.find("_exps.") != std::string::npos && hp_.n_expert > 0) {
      total += t.size_bytes / hp_.n_expert * hp_.n_expert_used;
      continue;
    }
    total += t.size_bytes;
  }
  return total;
}

}  // namespace kiln::model
