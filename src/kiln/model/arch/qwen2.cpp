// qwen2: Qwen 2 / 2.5. Biases on the q/k/v projections; neox (rotate-half) rope.
#include "kiln/model/arch/arch.h"
#include "kiln/model/arch/registry.h"

namespace kiln::model {
namespace {

constexpr ArchFeatures kFeatures{.qkv_bias = true, .rope_neox = true};

std::vector<TensorSpec> manifest(const HParams& hp) {
  return standard_manifest(hp, kFeatures);
}

}  // namespace

const ArchDef kArchQwen2{"qwen2", kFeatures, manifest};

}  // namespace kiln::model
