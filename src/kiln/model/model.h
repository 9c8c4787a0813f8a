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
#include "kiln/model/mesh.h"
#include "kiln/model/weights.h"
#include "kiln/util/status.h"

namespace kiln::model {

struct Placement;  // shard.h

// The KV cache a model needs, stored as `type` (one place for the hparams -> cache mapping).
backend::KvSpec kv_spec(const HParams& hp, quant::Type type = quant::Type::F16);
// The recurrent state of a hybrid model's linear layers (per sequence).
backend::StateSpec state_spec(const HParams& hp);

class Model;
// The same for the layers of a model's pipeline stage (Model::place; all of them when whole).
backend::KvSpec kv_spec(const Model& m, quant::Type type = quant::Type::F16);
backend::StateSpec state_spec(const Model& m);

class Model {
 public:
  // Opens, validates against the manifest, and builds the weight views. Norm vectors are
  // converted to F32 once (they are tiny).
  static Expected<std::unique_ptr<Model>> load(const std::string& path);
  static Expected<std::unique_ptr<Model>> from_file(std::unique_ptr<gguf::File> file);
  // The part of `full` that one rank of a device mesh holds (model/shard.cpp): each weight
  // cut by its placement (shard.h: place_tensor), the stage's layers only, and the rank's
  // hyperparameters (shard_hparams). Refuses a mesh that does not divide the model
  // (check_mesh) or a row-parallel weight split inside a quantization block. `full` must
  // outlive its shards (the parts not copied are views of it).
  static Expected<std::unique_ptr<Model>> shard(const Model& full, const MeshPlace& place);

  const HParams& hparams() const { return hp_; }
  const ArchDef& arch() const { return *arch_; }
  const gguf::File& file() const { return parent_ != nullptr ? parent_->file() : *file_; }
  // Where this model sits on a device mesh: a whole model is a mesh of one, all its layers.
  const MeshPlace& place() const { return place_; }

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
  // A shard's copies (or views) of a whole weight's rows or input columns (shard.cpp).
  Expected<backend::Weight> slice_rows(const backend::Weight& w, const Placement& p);
  Expected<backend::Weight> slice_cols(const backend::Weight& w, const Placement& p,
                                       const std::string& name, int tp);

  std::unique_ptr<gguf::File> file_;
  HParams hp_;
  const ArchDef* arch_ = nullptr;
  ModelWeights weights_;
  std::vector<LayerWeights> layers_;
  std::vector<LayerDesc> layer_descs_;
  std::vector<std::vector<float>> f32_vectors_;  // owned F32 copies of norm/bias vectors
  // A shard: the whole model, the rank's place, and the weights it had to copy.
  const Model* parent_ = nullptr;
  MeshPlace place_;
  std::vector<std::vector<uint8_t>> owned_bytes_;
};

}  // namespace kiln::model
