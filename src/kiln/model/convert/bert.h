// Hugging Face BertModel checkpoints (BGE, all-MiniLM, e5 ...) -> a `bert` GGUF with the
// tensor names (arch/bert_tensors.h) and metadata keys llama.cpp's converter writes:
// bert.{context_length, embedding_length, feed_forward_length, block_count,
// attention.head_count, attention.layer_norm_epsilon, attention.causal = false, pooling_type}
// and tokenizer.ggml.token_type_count, plus the WordPiece vocabulary when the folder has a
// tokenizer.json. kiln's forward computes exact (erf) GELU and absolute positions, so a
// config asking for anything else is refused rather than converted into wrong embeddings.
#pragma once

#include <nlohmann/json.hpp>

#include "kiln/gguf/writer.h"
#include "kiln/model/convert/hf_to_gguf.h"
#include "kiln/util/status.h"

namespace kiln::model {

// Whether config.json's architectures name a BertModel (or a BERT head llama.cpp converts).
bool is_bert_config(const nlohmann::json& config);

Expected<gguf::Writer> convert_bert(const ConvertOptions& opts, const nlohmann::json& config);

}  // namespace kiln::model
