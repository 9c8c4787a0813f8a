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
#include "kiln/model/weights.h"
#include "kiln/util/status.h"

namespace kiln::model {

// The KV cache a model needs, stored as `type` (one place for the hparams -> cache mapping).
backend::KvSpec kv_spec(const HParams& hp, quant::Type type = quant::Type::F16);
// The recurrent state of a hybrid model's linear layers (per sequence).
backend::StateSpec state_spec(const HParams& hp);

class Model {
 public:
  // Opens, validates against the manifest, and builds the weight views. Norm vectors are
  // converted to F32 once (they are tiny).
  static Expected<std::unique_ptr<Model>> load(const std::string& path);
  static Expected<std::unique_ptr<Model>> from_file(std::unique_ptr<gguf::File> file);

  const HParams& hparams() const { return hp_; }
  const ArchDef& arch() const { return *arch_; }
  const gguf::File& file() const { return *file_; }

  const ModelWeights& weights() const { return weights_; }
  const std::vector<LayerWeights>& layers() const { return layers_; }
  // The kind of each layer (ArchDef::layer), [n_layer].
  const std::vector<LayerDesc>& layer_descs() const { return layer_descs_; }
  // Bytes of weights read per generated token (all but the embedding table rows).
  uint64_t weight_bytes_per_token() const;

 private:
  Model() = default;
  // Loads every tensor of the manifest the file has into its field.
  Status bind(const TensorSpec& spec, const gguf::TensorInfo& t);
  backend::Weight weight(const gguf::TensorInfo& t) const;
  Expected<const float*> vector(const gguf::TensorInfo& t);

  std::unique_ptr<gguf::File> file_;
  HParams hp_;
  const ArchDef* arch_ = nullptr;
  ModelWeights weights_;
  std::vector<LayerWeights> layers_;
  std::vector<LayerDesc> layer_descs_;
  std::vector<std::vector<float>> f32_vectors_;  // owned F32 copies of norm/bias vectors
};

}  // namespace kiln::model
