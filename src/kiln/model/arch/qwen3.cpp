// qwen3: Qwen 3 dense. RMSNorm on q and k per head (before rope); no biases; neox rope.
#include "kiln/model/arch/arch.h"
#include "kiln/model/arch/registry.h"

namespace kiln::model {
namespace {

constexpr ArchFeatures kFeatures{.qk_norm = true, .rope_neox = true};

std::vector<TensorSpec> manifest(const HParams& hp) {
  std::vector<TensorSpec> out;
  add_embeddings(out, hp);
  for (uint32_t i = 0; i < hp.n_layer; ++i) {
    add_attention(out, hp, i, kFeatures);
    add_dense_ffn(out, hp, i);
  }
  return out;
}

}  // namespace

const ArchDef kArchQwen3{"qwen3", kFeatures, manifest};

}  // namespace kiln::model
