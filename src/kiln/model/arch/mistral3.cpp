// mistral3: the text model of Mistral Small 3.x / Ministral 3 / Magistral GGUFs (llama.cpp's
// LLM_ARCH_MISTRAL3; older conversions of the same models say "llama"). Llama's tensors and
// adjacent-pair rope; what differs is in the metadata: YaRN rope scaling with mscale_all_dim
// stored as rope.scaling.yarn_log_multiplier, and Llama 4 style attention temperature
// (attention.temperature_scale), both read by hparams.cpp. llama.cpp's graph also has a MoE
// branch (ffn_gate_inp); no released mistral3 model uses it and kiln refuses such a file
// (unexpected tensor 'blk.0.ffn_gate_inp.weight').
// Its manifest is llama's (llama_manifest).
#include "kiln/model/arch/arch.h"
#include "kiln/model/arch/registry.h"

namespace kiln::model {

const ArchDef kArchMistral3{"mistral3", ArchFeatures{}, llama_manifest};

}  // namespace kiln::model
