// A loaded model: the mapped GGUF file, its hyperparameters and architecture, and typed views
// of every weight (checked against the architecture's manifest at load).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kiln/backend/backend.h"
#include "kiln/backend/weight.h"
#include "kiln/gguf/gguf.h"
#include "kiln/kv/kv_cache.h"
#include "kiln/model/arch/arch.h"
#include "kiln/util/status.h"

namespace kiln::model {

struct LayerWeights {
  const float* attn_norm = nullptr;  // [n_embd]
  backend::Weight wq, wk, wv, wo;
  backend::Weight wqkv;       // phi3: fused [q | k | v] rows (then wq/wk/wv are empty)
  const float* bq = nullptr;  // qkv biases (qwen2)
  const float* bk = nullptr;
  const float* bv = nullptr;
  const float* q_norm = nullptr;  // [head_dim] (qwen3)
  const float* k_norm = nullptr;
  const float* attn_post_norm = nullptr;  // gemma: after attention, before the residual add
  const float* ffn_norm = nullptr;
  const float* ffn_post_norm = nullptr;  // gemma: after the FFN, before the residual add
  backend::Weight w_gate, w_up, w_down;
  // MoE (qwen3moe): router [n_embd -> n_expert] and the stacked experts; expert e of a stacked
  // weight is expert(w, e).
  backend::Weight w_gate_inp, w_gate_exps, w_up_exps, w_down_exps;
};

// The KV cache a model needs, stored as `type` (one place for the hparams -> cache mapping).
backend::KvSpec kv_spec(const HParams& hp, quant::Type type = quant::Type::F16);

class Model {
 public:
  // Opens, validates against the manifest, and builds the weight views. Norm vectors are
  // converted to F32 once (they are tiny).
  static Expected<std::unique_ptr<Model>> load(const std::string& path);
  static Expected<std::unique_ptr<Model>> from_file(std::unique_ptr<gguf::File> file);

  const HParams& hparams() const { return hp_; }
  const ArchDef& arch() const { return *arch_; }
  const gguf::File& file() const { return *file_; }

  const backend::Weight& tok_embd() const { return tok_embd_; }
  const backend::Weight& output() const { return output_; }  // tok_embd when tied
  const float* output_norm() const { return output_norm_; }
  const float* rope_freqs() const { return rope_freqs_; }  // null unless llama3 scaling
  const std::vector<LayerWeights>& layers() const { return layers_; }
  // Bytes of weights read per generated token (all but the embedding table rows).
  uint64_t weight_bytes_per_token() const;

 private:
  Model() = default;
  Expected<backend::Weight> weight(const std::string& name) const;
  Expected<const float*> vector(const std::string& name, bool required);

  std::unique_ptr<gguf::File> file_;
  HParams hp_;
  const ArchDef* arch_ = nullptr;
  backend::Weight tok_embd_, output_;
  const float* output_norm_ = nullptr;
  const float* rope_freqs_ = nullptr;
  std::vector<LayerWeights> layers_;
  std::vector<std::vector<float>> f32_vectors_;  // owned F32 copies of norm/bias vectors
};

}  // namespace kiln::model
