// qwen3moe: Qwen 3 MoE. Qwen3 attention (q/k norm) with routed experts: softmax gating,
// top-k (expert_used_count) with norm_topk_prob renormalisation, no shared expert.
#include "kiln/model/arch/arch.h"
#include "kiln/model/arch/registry.h"

namespace kiln::model {
namespace {

constexpr ArchFeatures kFeatures{.qk_norm = true, .moe = true, .rope_neox = true};

}  // namespace

const ArchDef kArchQwen3Moe{"qwen3moe", kFeatures, standard_manifest};

}  // namespace kiln::model
