// Hugging Face BertModel checkpoints (BGE, all-MiniLM, e5 ...) -> a `bert` GGUF with the
// tensor names (arch/bert_tensors.h) and metadata keys llama.cpp's converter writes:
// bert.{context_length, embedding_length, feed_forward_length, block_count,
// attention.head_count, attention.layer_norm_epsilon, attention.causal = false, pooling_type}
// and tokenizer.ggml.token_type_count, plus the WordPiece vocabulary when the folder has a
// tokenizer.json. kiln's forward computes exact (erf) GELU and absolute positions, so a
// config asking for anything else is refused rather than converted into wrong embeddings.
// The pieces below the converter are shared with the other BERT-family converter
// (convert/nomic_bert.h).
#pragma once

#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "kiln/gguf/writer.h"
#include "kiln/model/arch/bert_tensors.h"
#include "kiln/model/convert/hf_to_gguf.h"
#include "kiln/model/file_type.h"
#include "kiln/util/status.h"

namespace kiln::model {

// Whether config.json's architectures name a BertModel (or a BERT head llama.cpp converts).
bool is_bert_config(const nlohmann::json& config);

Expected<gguf::Writer> convert_bert(const ConvertOptions& opts, const nlohmann::json& config);

// config.json's integer `key`, in 1..2^30 (an error naming the key otherwise).
Expected<uint32_t> config_positive_u32(const nlohmann::json& config, const char* key);

// dir/tokenizer.json's WordPiece vocabulary (padded to config.json's vocab_size with unused
// "[PAD<id>]" tokens, as llama.cpp's converter does) into w, when the folder has one and
// opts.with_tokenizer; refused unless it is a WordPiece ("bert") vocabulary of n_vocab tokens.
// `model` names the architecture in messages.
Status write_wordpiece_vocab(gguf::Writer& w, const ConvertOptions& opts, uint32_t n_vocab,
                             std::string_view model);

// Every tensor of `tensors` that has a Hugging Face source, read from the folder's
// .safetensors files (a "bert." prefix accepted), its size checked against the spec, written
// as the file type asks (bert_tensor_always_f32 tables in F32). Tensors without a source are
// optional ones the checkpoint does not have.
Status write_encoder_tensors(gguf::Writer& w, const std::string& hf_dir,
                             const std::vector<BertTensor>& tensors, const FileType& ft,
                             const HParams& hp);

}  // namespace kiln::model
