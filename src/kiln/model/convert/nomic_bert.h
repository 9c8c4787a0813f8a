// Hugging Face NomicBertModel checkpoints (nomic-embed-text-v1 / v1.5: remote code, config
// model_type "nomic_bert") -> a `nomic-bert` GGUF as llama.cpp's converter writes it
// (convert_hf_to_gguf.py NomicBertModel): the tensors of arch/bert_tensors.h
// (nomic_bert_tensors), the keys nomic-bert.{context_length, embedding_length,
// feed_forward_length, block_count, attention.head_count, attention.layer_norm_epsilon,
// attention.causal = false, rope.freq_base, pooling_type}, tokenizer.ggml.token_type_count and
// the WordPiece vocabulary (bert-base-uncased's, padded to vocab_size).
// Only the published text models' switches are converted (swiglu, rotary over the whole head
// with rotate-half pairs and no scaling, no q/k/v or MLP biases, post-norm LayerNorm,
// non-causal); any other config is refused naming the key, and so is nomic-bert-moe
// (nomic-embed-text-v2-moe), whose experts kiln does not run.
#pragma once

#include <nlohmann/json.hpp>

#include "kiln/gguf/writer.h"
#include "kiln/model/convert/hf_to_gguf.h"
#include "kiln/util/status.h"

namespace kiln::model {

// Whether config.json is a NomicBertModel's (architectures or model_type "nomic_bert").
bool is_nomic_bert_config(const nlohmann::json& config);

Expected<gguf::Writer> convert_nomic_bert(const ConvertOptions& opts, const nlohmann::json& config);

}  // namespace kiln::model
