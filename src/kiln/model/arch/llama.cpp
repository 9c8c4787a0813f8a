// llama: Llama 2/3.x, Mistral 7B (which converters also label llama), TinyLlama, SmolLM.
// Rope on adjacent pairs (llama.cpp's converter permutes HF's rotate-half Q/K rows so that
// GGUF files use the "normal" rope).
#include "kiln/model/arch/arch.h"
#include "kiln/model/arch/registry.h"

namespace kiln::model {

std::vector<TensorSpec> llama_manifest(const HParams& hp) {
  constexpr ArchFeatures kFeatures{};
  std::vector<TensorSpec> out;
  add_embeddings(out, hp);
  // Llama 3.x files with rope scaling may carry precomputed frequency factors.
  out.push_back({"rope_freqs.weight", {hp.n_rot / 2}, TensorKind::kNorm, false});
  for (uint32_t i = 0; i < hp.n_layer; ++i) {
    add_attention(out, hp, i, kFeatures);
    add_dense_ffn(out, hp, i, kFeatures);
  }
  return out;
}

const ArchDef kArchLlama{"llama", ArchFeatures{}, llama_manifest};

}  // namespace kiln::model
