// llama: Llama 2/3.x, Mistral 7B (which converters also label llama), TinyLlama, SmolLM.
// Rope on adjacent pairs (llama.cpp's converter permutes HF's rotate-half Q/K rows so that
// GGUF files use the "normal" rope).
#include "kiln/model/arch/arch.h"
#include "kiln/model/arch/registry.h"

namespace kiln::model {

std::vector<TensorSpec> llama_manifest(const ArchDef& arch, const HParams& hp) {
  std::vector<TensorSpec> out = standard_manifest(arch, hp);
  // Llama 3.x files with rope scaling may carry precomputed frequency factors.
  out.insert(out.begin() + 3, {"rope_freqs.weight",
                               {hp.n_rot / 2},
                               TensorKind::kNorm,
                               false,
                               -1,
                               &ModelWeights::rope_freqs});
  return out;
}

const ArchDef kArchLlama{"llama", ArchFeatures{}, llama_manifest};

}  // namespace kiln::model
