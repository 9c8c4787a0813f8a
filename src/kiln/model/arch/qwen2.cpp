// qwen2: Qwen 2 / 2.5. Biases on the q/k/v projections; neox (rotate-half) rope.
#include "kiln/model/arch/arch.h"
#include "kiln/model/arch/registry.h"

namespace kiln::model {
namespace {

constexpr ArchFeatures kFeatures{.qkv_bias = true, .rope_neox = true};

}  // namespace

const ArchDef kArchQwen2{"qwen2", kFeatures, standard_manifest};

}  // namespace kiln::model
