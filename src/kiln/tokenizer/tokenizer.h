// Text to token ids and back, with exactly the ids the Hugging Face tokenizer of the same
// vocabulary gives (tests/oracle/tokenizer checks this against tokenizers.js).
//
// Three model families, chosen by VocabData::model:
//   "gpt2"  byte-level BPE: special-token split, NFC where the vocabulary's pre-tokenizer
//           implies it (Qwen), regex pre-tokenizer (PCRE2 JIT), bytes mapped to GPT-2's
//           byte alphabet, merges by rank with a priority queue, a per-word cache.
//   "llama" SentencePiece BPE: special-token split, "▁" prefix per text fragment when
//           add_space_prefix, spaces to "▁", merges by rank (when the vocabulary carries
//           merges) or by score (llama.cpp's SPM rule), byte fallback to <0xXX> tokens.
//   "bert"  WordPiece: special-token split, BertNormalizer, BertPreTokenizer, greedy longest
//           match over llama.cpp's phantom-space vocabulary (wordpiece.h), [CLS] .. [SEP].
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/tokenizer/vocab.h"
#include "kiln/util/status.h"

namespace kiln::tokenizer {

// A byte range [begin, end) of a text.
struct TextRange {
  size_t begin = 0;
  size_t end = 0;
};

class Tokenizer {
 public:
  // Validates the vocabulary and builds the lookup tables. Fails naming the problem: an
  // unknown model or pre-tokenizer name, a special-token id out of range, a missing merge
  // table, mismatched array lengths.
  static Expected<Tokenizer> create(VocabData vocab);

  // Token ids of `text` (must be valid UTF-8, else an error naming the byte offset).
  // add_special: add BOS/EOS as the vocabulary says (HF add_special_tokens).
  // parse_special: text spelling a control token ("<|im_start|>") becomes that token;
  // when false only user-defined added tokens are matched (as llama.cpp does).
  Expected<std::vector<int32_t>> encode(std::string_view text, bool add_special,
                                        bool parse_special) const;
  // The same, except that with parse_special no control token is matched where its text
  // would overlap one of the `literal` ranges (sorted, not overlapping): that text stays plain
  // text, tokenized with its neighbours as if parse_special were off there. A chat prompt
  // passes the ranges that came from message content, so only the template's own markup
  // makes control tokens.
  Expected<std::vector<int32_t>> encode(std::string_view text, bool add_special, bool parse_special,
                                        std::span<const TextRange> literal) const;
  // Where encode(text, .., parse_special = true) would match a control token that it would
  // not match with parse_special off (user-defined added tokens always match).
  std::vector<TextRange> find_control_texts(std::string_view text) const;

  // Text of `ids` as Hugging Face's decode gives it (clean_up_tokenization_spaces off):
  // byte sequences that are not valid UTF-8 become U+FFFD. skip_special drops control
  // and unknown tokens. Ids out of range contribute nothing.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;

  // The raw bytes one token adds to decode's output (may be part of a UTF-8 sequence);
  // decode(ids) is repair(concatenation of pieces) minus the stripped leading space.
  std::string_view token_piece(int32_t id, bool skip_special = false) const;
  // tokenizer.ggml.tokens[id], or "" when out of range.
  std::string_view token_text(int32_t id) const;
  TokenType token_type(int32_t id) const;
  std::optional<int32_t> find_token(std::string_view text) const;
  int32_t num_tokens() const;

  // SentencePiece decoders drop the single leading space the encoder's "▁" prefix adds.
  bool strips_leading_space() const;
  bool add_bos() const;
  bool add_eos() const;
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  const VocabData& vocab() const;

 private:
  struct Impl;
  std::shared_ptr<const Impl> impl_;
};

}  // namespace kiln::tokenizer
