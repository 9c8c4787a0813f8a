// The tensors of a `bert` GGUF (BertModel encoders: BGE, all-MiniLM, e5...), named and shaped
// exactly as llama.cpp's converter writes them (convert_hf_to_gguf.py BertModel, gguf-py
// tensor_mapping.py), with the Hugging Face name each comes from and the field it loads into.
// The architecture's manifest (arch/bert.cpp) and the converter (convert/bert.cpp) both read
// this list.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/model/arch/arch.h"

namespace kiln::model {

// The config values the bert tensors' shapes derive from (`bert.*` GGUF keys).
struct BertDims {
  uint32_t n_vocab = 0;        // token_embd rows (tokenizer.ggml.tokens length)
  uint32_t n_embd = 0;         // bert.embedding_length
  uint32_t n_layer = 0;        // bert.block_count
  uint32_t n_ff = 0;           // bert.feed_forward_length
  uint32_t n_ctx_train = 0;    // bert.context_length: position_embd rows
  uint32_t n_token_types = 0;  // tokenizer.ggml.token_type_count (type_vocab_size)
};

// One tensor of the list and its Hugging Face source ("" when it has none).
struct BertTensor {
  TensorSpec spec;
  std::string hf_name;  // without the "bert." prefix BertForMaskedLM checkpoints add
};

// In llama.cpp's order: token_embd, token_types, position_embd, token_embd_norm (weight,
// bias), then per layer attn_q/k/v (weight, bias), attn_output (weight, bias),
// attn_output_norm (weight, bias), ffn_up (weight, bias), ffn_down (weight, bias),
// layer_output_norm (weight, bias). Matmul weights are kWeight; every 1-D tensor is kNorm.
// token_types and position_embd are 2-D tables that llama.cpp keeps in F32 (see
// bert_tensor_always_f32).
std::vector<BertTensor> bert_tensors(const BertDims& d);
std::vector<TensorSpec> bert_manifest(const BertDims& d);
bool bert_tensor_always_f32(std::string_view gguf_name);

}  // namespace kiln::model
