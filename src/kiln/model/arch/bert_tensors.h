// The tensors of a `bert` GGUF (BertModel encoders: BGE, all-MiniLM, e5...) and of a
// `nomic-bert` GGUF (NomicBertModel: nomic-embed-text-v1 / v1.5), named and shaped exactly as
// llama.cpp's converter writes them (convert_hf_to_gguf.py BertModel / NomicBertModel, gguf-py
// tensor_mapping.py), with the Hugging Face name each comes from and the field it loads into.
// Each architecture's manifest (arch/bert.cpp, arch/nomic_bert.cpp) and its converter
// (convert/bert.cpp, convert/nomic_bert.cpp) read the same list.
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

// The config values the nomic-bert tensors' shapes derive from (`nomic-bert.*` GGUF keys).
struct NomicBertDims {
  uint32_t n_vocab = 0;        // token_embd rows (config vocab_size, padded to a multiple of 64)
  uint32_t n_embd = 0;         // nomic-bert.embedding_length (n_embd)
  uint32_t n_layer = 0;        // nomic-bert.block_count (n_layer)
  uint32_t n_ff = 0;           // nomic-bert.feed_forward_length (n_inner)
  uint32_t n_token_types = 0;  // tokenizer.ggml.token_type_count (type_vocab_size)
  // attn_qkv's output width: q + k + v (llama.cpp: n_embd + 2 n_embd_gqa; the published models
  // have as many k/v heads as q heads: 3 n_embd).
  uint32_t n_qkv = 0;
};

// token_embd, token_types, token_embd_norm (weight, bias), then per layer attn_qkv (fused
// [q | k | v] rows, no bias), attn_output, attn_output_norm (weight, bias), ffn_up (HF fc11),
// ffn_gate (fc12: SwiGLU's silu side), ffn_down (fc2), layer_output_norm (weight, bias). No
// position table: positions are rotary. llama.cpp also accepts attn_output, ffn_up and
// ffn_down biases (nomic-bert-moe has them); they are listed as optional, with no HF source,
// and the forward adds them when a file has them.
std::vector<BertTensor> nomic_bert_tensors(const NomicBertDims& d);
std::vector<TensorSpec> nomic_bert_manifest(const NomicBertDims& d);

}  // namespace kiln::model
