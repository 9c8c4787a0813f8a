// qwen3: Qwen 3 dense. RMSNorm on q and k per head (before rope); no biases; neox rope.
#include "kiln/model/arch/arch.h"
#include "kiln/model/arch/registry.h"

namespace kiln::model {
namespace {

constexpr ArchFeatures kFeatures{.qk_norm = true, .rope_neox = true};

}  // namespace

const ArchDef kArchQwen3{"qwen3", kFeatures, standard_manifest};

}  // namespace kiln::model
