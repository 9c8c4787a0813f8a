#include "kiln/model/model.h"

#include "kiln/model/arch/with_field.h"
#include "kiln/model/hparams.h"
#include "kiln/quant/convert.h"

namespace kiln::model {

backend::KvSpec kv_spec(const HParams& hp, quant::Type type) {
  backend::KvSpec s;
  s.n_layer = static_cast<int32_t>(hp.n_kv_layers());
  s.n_kv_heads = static_cast<int32_t>(hp.n_head_kv);
  s.head_dim_k = static_cast<int32_t>(hp.head_dim_k);
  s.head_dim_v = static_cast<int32_t>(hp.head_dim_v);
  s.type = type;
  s.block_tokens = kv::kBlockTokens;
  return s;
}

backend::StateSpec state_spec(const HParams& hp) {
  backend::StateSpec s;
  s.n_layer = static_cast<int32_t>(hp.n_linear_layers());
  s.conv_dim = static_cast<int32_t>(hp.linear_conv_dim());
  s.conv_k = static_cast<int32_t>(hp.linear_conv_kernel);
  s.n_k_heads = static_cast<int32_t>(hp.linear_n_k_heads);
  s.n_v_heads = static_cast<int32_t>(hp.linear_n_v_heads);
  s.head_k_dim = static_cast<int32_t>(hp.linear_head_k_dim);
  s.head_v_dim = static_cast<int32_t>(hp.linear_head_v_dim);
  return s;
}

backend::KvSpec kv_spec(const Model& m, quant::Type type) {
  backend::KvSpec s = kv_spec(m.hparams(), type);
  int32_t kv = 0;
  for (uint32_t il = m.place().first_layer; il < m.place().last_layer; ++il)
    kv += m.hparams().linear_layer(il) ? 0 : 1;
  s.n_layer = kv;
  return s;
}

backend::StateSpec state_spec(const Model& m) {
  backend::StateSpec s = state_spec(m.hparams());
  int32_t linear = 0;
  for (uint32_t il = m.place().first_layer; il < m.place().last_layer; ++il)
    linear += m.hparams().linear_layer(il) ? 1 : 0;
  s.n_layer = linear;
  return s;
}

Expected<std::unique_ptr<Model>> Model::load(const std::string& path) {
  KILN_TRY(std::unique_ptr<gguf::File> file, gguf::File::open(path));
  return from_file(std::move(file));
}

backend::Weight Model::weight(const gguf::TensorInfo& t) const {
  // check_manifest has checked the shape (2-D, or 3-D for stacked experts; 1-D: one row, the
  // shared expert's gate) and the type.
  backend::Weight w;
  w.type = t.type;
  w.n_in = t.ne[0];
  w.n_out = t.ne.size() > 1 ? t.ne[1] : 1;
  w.n_mats = t.ne.size() > 2 ? t.ne[2] : 1;
  w.data = t.data;
  w.row_bytes = *quant::row_bytes(t.type, static_cast<uint64_t>(t.ne[0]));
  return w;
}

Expected<const float*> Model::vector(const gguf::TensorInfo& t) {
  std::vector<float> v(static_cast<size_t>(t.num_elements()));
  KILN_TRY_STATUS(quant::dequantize_row(t.type, t.data, v.data(), t.num_elements()));
  f32_vectors_.push_back(std::move(v));
  return static_cast<const float*>(f32_vectors_.back().data());
}

Status Model::bind(const TensorSpec& spec, const gguf::TensorInfo& t) {
  return with_field(
      spec, layers_, weights_,
      [&](backend::Weight& w) -> Status {
        w = weight(t);
        return {};
      },
      [&](const float*& v) -> Status {
        KILN_TRY(v, vector(t));
        return {};
      });
}

Expected<std::unique_ptr<Model>> Model::from_file(std::unique_ptr<gguf::File> file) {
  std::unique_ptr<Model> m(new Model());
  m->file_ = std::move(file);
  KILN_TRY(m->hp_, read_hparams(*m->file_));
  m->arch_ = find_arch(m->hp_.arch);
  KILN_TRY_STATUS(check_manifest(*m->file_, *m->arch_, m->hp_));
  m->layers_.resize(m->hp_.n_layer);
  for (uint32_t i = 0; i < m->hp_.n_layer; ++i)
    m->layer_descs_.push_back(describe_layer(*m->arch_, m->hp_, i));
  // check_manifest has checked that every required tensor is there.
  for (const TensorSpec& spec : tensor_manifest(*m->arch_, m->hp_)) {
    if (const gguf::TensorInfo* t = m->file_->find_tensor(spec.name))
      KILN_TRY_STATUS(m->bind(spec, *t));
  }
  if (m->weights_.output.empty()) m->weights_.output = m->weights_.tok_embd;  // tied
  m->place_.last_layer = m->hp_.n_main_layers();
  return m;
}

uint64_t Model::weight_bytes_per_token() const {
  uint64_t total = 0;
  for (const gguf::TensorInfo& t : file().tensors()) {
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
