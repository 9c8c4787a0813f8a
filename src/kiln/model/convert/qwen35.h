// Hugging Face checkpoints of the hybrid Qwen family -> GGUF, as llama.cpp's converter writes
// them: Qwen3_5ForCausalLM / Qwen3_5ForConditionalGeneration (text part) -> qwen35,
// Qwen3_5MoeForCausalLM / ...ForConditionalGeneration -> qwen35moe, Qwen3NextForCausalLM ->
// qwen3next. What the converter changes on the way (arch/qwen35.cpp reads it so):
//  - the (1 + w) RMSNorm weights are stored as 1 + w (the gated linear_attn.norm excepted),
//  - A_log is stored as ssm_a = -exp(A_log), the conv weight [C, 1, K] as [C, K],
//  - qwen35/qwen35moe: the value heads of the linear layers (rows of the v part of
//    in_proj_qkv, of in_proj_z, in_proj_a, in_proj_b, dt_bias, A_log, the v channels of the
//    conv, columns of out_proj) go from grouped by key head to tiled;
//  - qwen3next: in_proj_qkvz, grouped per key head as [q, k, v, z], is split into attn_qkv
//    ([all q | all k | all v]) and attn_gate (z); in_proj_ba is kept as ssm_ba.
// Multi-token-prediction weights (mtp.*) are left out (llama.cpp's --no-mtp).
#pragma once

#include <nlohmann/json.hpp>

#include "kiln/gguf/writer.h"
#include "kiln/model/convert/hf_to_gguf.h"
#include "kiln/util/status.h"

namespace kiln::model {

// Whether config.json's architectures name one of the hybrid Qwen checkpoints.
bool is_qwen35_config(const nlohmann::json& config);

Expected<gguf::Writer> convert_qwen35(const ConvertOptions& opts, const nlohmann::json& config);

// The GGUF hyperparameters of such a config.json (the text config of a multimodal one).
Expected<HParams> qwen35_hparams(const nlohmann::json& config);

// The reorder of value heads from grouped by key head ([g0 v0..v(r-1), g1 v0..]) to tiled
// ([g0 v0, g1 v0, ..., g0 v1, ...]) along a dimension of `outer` x (n_k * r * width) x
// `inner` values: each head is `width` consecutive entries of that dimension.
std::vector<float> tile_value_heads(const std::vector<float>& x, int64_t outer, int64_t n_k,
                                    int64_t r, int64_t width, int64_t inner);

}  // namespace kiln::model
