// The vocabulary of a model as GGUF stores it: exactly the `tokenizer.ggml.*` keys that
// llama.cpp's converter (convert_hf_to_gguf.py, gguf-py SpecialVocab) writes, plus the
// chat template. Both the GGUF loader and the Hugging Face importer produce this struct;
// Tokenizer::create turns it into a working tokenizer.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kiln::tokenizer {

// tokenizer.ggml.token_type values (llama.cpp llama_token_type; on disk, append-only).
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

struct VocabData {
  // tokenizer.ggml.model: "gpt2" (byte-level BPE), "llama" (SentencePiece BPE) or "bert"
  // (WordPiece, tokens in llama.cpp's phantom-space form: see wordpiece.h).
  std::string model;
  // tokenizer.ggml.pre: the pre-tokenizer name ("llama-bpe", "qwen2", "gpt-2", "default"...).
  std::string pre;
  // tokenizer.ggml.tokens: token text by id. Byte-level vocabularies keep the GPT-2
  // byte-to-unicode form ("Ġthe"); SentencePiece keeps "▁the" and "<0x0A>"; added tokens
  // keep their literal text ("<|im_start|>").
  std::vector<std::string> tokens;
  // tokenizer.ggml.token_type (TokenType values), one per token; empty means all normal.
  std::vector<int32_t> token_type;
  // tokenizer.ggml.scores, one per token; empty when the file has none (gpt2 models).
  std::vector<float> scores;
  // tokenizer.ggml.merges: "left right" in rank order (rank 0 first).
  std::vector<std::string> merges;

  std::optional<int32_t> bos_id;   // tokenizer.ggml.bos_token_id
  std::optional<int32_t> eos_id;   // tokenizer.ggml.eos_token_id
  std::optional<int32_t> eot_id;   // tokenizer.ggml.eot_token_id
  std::optional<int32_t> eom_id;   // tokenizer.ggml.eom_token_id
  std::optional<int32_t> unk_id;   // tokenizer.ggml.unknown_token_id
  std::optional<int32_t> pad_id;   // tokenizer.ggml.padding_token_id
  std::optional<int32_t> sep_id;   // tokenizer.ggml.seperator_token_id (sic, llama.cpp's key)
  std::optional<int32_t> cls_id;   // tokenizer.ggml.cls_token_id
  std::optional<int32_t> mask_id;  // tokenizer.ggml.mask_token_id

  // Absent keys take llama.cpp's defaults per model and pre-tokenizer (Tokenizer::create).
  std::optional<bool> add_bos_token;     // tokenizer.ggml.add_bos_token
  std::optional<bool> add_eos_token;     // tokenizer.ggml.add_eos_token
  std::optional<bool> add_space_prefix;  // tokenizer.ggml.add_space_prefix
  // WordPiece (bert): BertNormalizer's lowercase and strip_accents. llama.cpp has no key for
  // them (it always lowercases); kiln writes its own keys when a converted tokenizer.json
  // says so, and an absent key means true (uncased BERT, BGE, nomic-embed).
  std::optional<bool> bert_lowercase;      // kiln.tokenizer.bert.lowercase
  std::optional<bool> bert_strip_accents;  // kiln.tokenizer.bert.strip_accents

  // tokenizer.chat_template (from tokenizer_config.json); empty when there is none.
  std::string chat_template;
};

}  // namespace kiln::tokenizer
