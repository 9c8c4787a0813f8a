// gemma2: Gemma 2. Embeddings scaled by sqrt(n_embd); RMSNorm before and after attention and
// FFN (GGUF stores Gemma's (1 + w) norm weights already added); GELU-tanh gated FFN; neox
// rope; attention and final logits soft-capped; every other layer (even ones) slides.
#include "kiln/model/arch/arch.h"
#include "kiln/model/arch/registry.h"

namespace kiln::model {
namespace {

constexpr ArchFeatures kFeatures{
    .rope_neox = true, .gelu = true, .embed_scale = true, .sandwich_norm = true};

}  // namespace

const ArchDef kArchGemma2{"gemma2", kFeatures, standard_manifest, {.swa_pattern = 2}};

}  // namespace kiln::model
