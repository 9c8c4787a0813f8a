// BERT's WordPiece tokenizer pieces, as Hugging Face tokenizers (Rust) defines them:
// BertNormalizer, BertPreTokenizer and the WordPiece model's greedy longest-match.
//
// Vocabulary form: GGUF files (llama.cpp's converter, tokenizer.ggml.model = "bert") store
// the vocabulary in "phantom space" form: a word-initial piece "the" as "▁the", a
// continuation piece "##ing" as "ing", control tokens ("[CLS]") as they are. kiln keeps that
// form (hf_import converts tokenizer.json's "##" form to it), so a word's first piece is
// looked up with the "▁" prefix and every later piece without.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::tokenizer::wordpiece {

// HF's WordPiece max_input_chars_per_word default (every BERT tokenizer.json kiln has seen):
// a longer word becomes the unknown token.
constexpr size_t kMaxInputCharsPerWord = 100;

// BertNormalizer's switches (tokenizer.json normalizer; strip_accents null means lowercase).
struct NormalizerOptions {
  bool clean_text = true;            // drop NUL, U+FFFD and controls; whitespace -> ' '
  bool handle_chinese_chars = true;  // ' ' around every CJK ideograph
  bool strip_accents = true;         // NFD, then drop nonspacing marks (Mn)
  bool lowercase = true;             // Unicode full lowercase, code point by code point
};

// The normalized text (text must be valid UTF-8), in HF's order: clean, CJK, accents, case.
std::string normalize(std::string_view text, const NormalizerOptions& opts);

// BertPreTokenizer: words split at whitespace (dropped) with every punctuation character
// (ASCII punctuation or Unicode P*) a word of its own. Appends views into `text`.
void pre_tokenize(std::string_view text, std::vector<std::string_view>& words);

// Greedy longest-match of one word: the first piece is looked up as "▁" + text, later ones
// as text. lookup returns the id of a piece text or nullopt. Appends the pieces' ids, or
// unk_id alone when some part of the word matches nothing or the word is longer than
// kMaxInputCharsPerWord characters (nothing when there is no unk_id, as HF errors there).
void encode_word(std::string_view word,
                 const std::function<std::optional<int32_t>(std::string_view)>& lookup,
                 std::optional<int32_t> unk_id, std::vector<int32_t>& out);

// What a vocabulary token adds to decoded text under HF's WordPiece decoder (cleanup on):
// " " + word for a word-initial piece or a special token, the bare text of a continuation,
// then the decoder's cleanup (" ." -> ".", " ," -> ",", " n't" -> "n't", ...).
std::string decode_piece(std::string_view token_text, bool is_special);

}  // namespace kiln::tokenizer::wordpiece
