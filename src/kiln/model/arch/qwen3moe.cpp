// qwen3moe: Qwen 3 MoE. Qwen3 attention (q/k norm) with routed experts: softmax gating,
// top-k (expert_used_count) with norm_topk_prob renormalisation, no shared expert.
#include "kiln/model/arch/arch.h"
#include "kiln/model/arch/registry.h"

namespace kiln::model {
namespace {

constexpr ArchFeatures kFeatures{.qk_norm = true, .moe = true, .rope_neox = true};

std::vector<TensorSpec> manifest(const HParams& hp) {
  std::vector<TensorSpec> out;
  add_embeddings(out, hp);
  for (uint32_t i = 0; i < hp.n_layer; ++i) {
    add_attention(out, hp, i, kFeatures);
    add_moe_ffn(out, hp, i);
  }
  return out;
}

}  // namespace

const ArchDef kArchQwen3Moe{"qwen3moe", kFeatures, manifest};

}  // namespace kiln::model
