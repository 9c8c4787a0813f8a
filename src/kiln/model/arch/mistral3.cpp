// mistral3: the text model of Mistral Small 3.x / Ministral 3 / Magistral GGUFs (llama.cpp's
// LLM_ARCH_MISTRAL3; older conversions of the same models say "llama"). Llama's tensors and
// adjacent-pair rope; what differs is in the metadata: YaRN rope scaling with mscale_all_dim
// stored as rope.scaling.yarn_log_multiplier, and Llama 4 style attention temperature
// (attention.temperature_scale), both read by hparams.cpp. llama.cpp's graph also has a MoE
// branch (ffn_gate_inp); no released mistral3 model uses it and kiln refuses such a file
// (unexpected tensor 'blk.0.ffn_gate_inp.weight').
#include "kiln/model/arch/arch.h"
#include "kiln/model/arch/registry.h"

namespace kiln::model {
namespace {

constexpr ArchFeatures kFeatures{};

std::vector<TensorSpec> manifest(const HParams& hp) {
  std::vector<TensorSpec> out;
  add_embeddings(out, hp);
  out.push_back({"rope_freqs.weight", {hp.n_rot / 2}, TensorKind::kNorm, false});
  for (uint32_t i = 0; i < hp.n_layer; ++i) {
    add_attention(out, hp, i, kFeatures);
    add_dense_ffn(out, hp, i, kFeatures);
  }
  return out;
}

}  // namespace

const ArchDef kArchMistral3{"mistral3", kFeatures, manifest};

}  // namespace kiln::model
