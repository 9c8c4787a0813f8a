// phi3: Phi-3 / Phi-3.5 / Phi-4-mini. Fused q|k|v projection (attn_qkv) and fused gate|up
// (ffn_up, [gate | up] rows); neox rope.
#include "kiln/model/arch/arch.h"
#include "kiln/model/arch/registry.h"

namespace kiln::model {
namespace {

constexpr ArchFeatures kFeatures{.rope_neox = true, .fused_qkv = true, .fused_gate_up = true};

}  // namespace

const ArchDef kArchPhi3{"phi3", kFeatures, standard_manifest};

}  // namespace kiln::model
