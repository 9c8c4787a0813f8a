// gemma3: Gemma 3 (text). Gemma 2's layout plus RMSNorm on q and k per head, no attention
// soft-capping; five sliding layers per global one by default, the sliding layers with their
// own rope base (10000).
#include "kiln/model/arch/arch.h"
#include "kiln/model/arch/registry.h"

namespace kiln::model {
namespace {

constexpr ArchFeatures kFeatures{
    .qk_norm = true, .rope_neox = true, .gelu = true, .embed_scale = true, .sandwich_norm = true};

}  // namespace

const ArchDef kArchGemma3{
    "gemma3",
    kFeatures,
    standard_manifest,
    {.swa_pattern = 6, .rope_freq_base_swa = 10000.0f, .rope_scaling_swa = false}};

}  // namespace kiln::model
