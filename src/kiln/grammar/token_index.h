// A vocabulary seen as bytes, for token masks: every token's bytes, and a byte trie of the
// tokens laid out in preorder, so that a walk can skip a whole subtree (every token that
// starts with a rejected prefix) by jumping to its end.
//
// Two tries are kept: one over the tokens' bytes, and one over their UTF-8 classes (every byte
// >= 0x80 replaced by the first byte of its class, see utf8_class), where all the tokens of a
// script that differ only in which letters they hold share one path (the 30k non-ASCII tokens of
// Llama-3 are 62k byte-trie nodes and 15k class-trie nodes). A grammar whose terminals never
// split a class (JSON Schema strings, `.`, negated ASCII classes) is walked on the class trie.
//
// Built once per tokenizer (about 200 ms for a 150k vocabulary) and shared by every grammar.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>
#include <vector>

#include "kiln/grammar/grammar.h"
#include "kiln/tokenizer/tokenizer.h"

namespace kiln::grammar {

class TokenIndex {
 public:
  // Tokens are the tokenizer's pieces (raw bytes); control and unknown tokens are never part
  // of a constrained output. end_tokens (EOS, EOT, EOM of the vocabulary) are allowed exactly
  // where the grammar may end.
  static std::shared_ptr<const TokenIndex> create(const tokenizer::Tokenizer& tok);
  // The same with the caller's end tokens (the engine's end-of-generation ids).
  static std::shared_ptr<const TokenIndex> create(const tokenizer::Tokenizer& tok,
                                                  std::vector<int32_t> end_tokens);
  // For tests: an explicit vocabulary; tokens with empty bytes are never allowed, and
  // control_tokens (control tokens: their bytes are their text) only through token terminals.
  static std::shared_ptr<const TokenIndex> create(std::vector<std::string> token_bytes,
                                                  std::vector<int32_t> end_tokens,
                                                  std::vector<int32_t> control_tokens = {});

  int32_t num_tokens() const { return num_tokens_; }
  // Words of a token bitmask: ceil(num_tokens / 64).
  int32_t mask_words() const { return (num_tokens_ + 63) / 64; }
  // A token's bytes; a control token's text (it is in no trie: only a token terminal of the
  // grammar allows it).
  std::string_view token_bytes(int32_t id) const;
  // The tokens whose whole text is `text` (control tokens and trie tokens), for the grammar's
  // token terminals.
  std::vector<int32_t> tokens_with_text(std::string_view text) const;
  bool in_trie(int32_t id) const { return id >= 0 && id < num_tokens_ && in_trie_[id]; }
  std::span<const int32_t> end_tokens() const { return end_tokens_; }
  bool is_end_token(int32_t id) const;

  // A trie in preorder (the root is implicit: nodes at depth 1 start with one byte).
  struct Node {
    uint8_t byte;
    uint8_t pad;
    uint16_t depth;   // 1 for a first byte
    uint16_t height;  // longest path below this node, in bytes (0 for a leaf)
    // Characters begun by the longest path below this node when every path below, read from a
    // character boundary, is valid UTF-8 (its last character may be cut short); else kNotText.
    uint16_t text_chars;
    int32_t end;         // first node after this node's subtree
    int32_t tok_begin;   // tokens of this node, then of its subtree, in trie_tokens
    int32_t own_end;     // [tok_begin, own_end): tokens whose bytes end at this node
    int32_t tok_end;     // [own_end, tok_end): tokens strictly below this node
    int32_t desc_bytes;  // index in desc_sets: bytes of every node strictly below
  };
  static constexpr uint16_t kNotText = 0xFFFF;
  struct Trie {
    std::vector<Node> nodes;
    std::vector<int32_t> tokens;     // token ids in preorder of their nodes
    std::vector<ByteSet> desc_sets;  // deduplicated
    int32_t max_depth = 0;
    const ByteSet& desc_set(const Node& n) const { return desc_sets[n.desc_bytes]; }
  };
  const Trie& byte_trie() const { return byte_trie_; }
  const Trie& class_trie() const { return class_trie_; }
  // The byte trie's nodes (for reports).
  std::span<const Node> nodes() const { return byte_trie_.nodes; }
  // Every token of the tries (the allowed non-end tokens), as a mask of mask_words() words.
  std::span<const uint64_t> trie_mask() const { return trie_mask_; }

  // A token as text: its ASCII bytes, whether its bytes are valid UTF-8 (the last character
  // may be cut short) and how many characters they begin.
  struct TokenText {
    std::array<uint64_t, 2> ascii{};
    uint16_t num_chars = 0;
    bool valid_utf8 = false;
    bool non_ascii = false;
  };
  const TokenText& token_text(int32_t id) const { return token_text_[id]; }
  // The trie's tokens that hold byte b (each token once per distinct byte).
  std::span<const int32_t> tokens_with_byte(uint8_t b) const {
    return std::span<const int32_t>(byte_tokens_)
        .subspan(byte_token_offsets_[b], byte_token_offsets_[b + 1] - byte_token_offsets_[b]);
  }

  // The tokens that are text of one kind: their ASCII bytes in `ascii`, and either ASCII only
  // or (multibyte) valid UTF-8; as masks by the number of characters they begin. Built on first
  // use per kind and kept (the kinds a server meets are few: JSON string characters, the
  // characters of a format or a pattern); the JSON string kind is built with the index.
  static constexpr int32_t kTextUpTo = 16;
  struct TextTokens {
    ByteSet ascii;
    bool multibyte = false;
    std::vector<std::vector<uint64_t>> up_to;  // [kTextUpTo + 1]: tokens of at most n chars
    std::vector<uint64_t> all;
  };
  std::shared_ptr<const TextTokens> text_tokens(const ByteSet& ascii, bool multibyte) const;
  // The trie's tokens that begin more than kTextUpTo characters.
  std::span<const int32_t> long_tokens() const { return long_tokens_; }

  // The UTF-8 class of a byte, named by its first byte: ASCII bytes are their own class; then
  // continuation bytes 80-8F, 90-9F, A0-BF (split where E0, ED, F0 and F4 restrict the second
  // byte), C0-C1 (never valid), C2-DF, E0, E1-EC, ED, EE-EF, F0, F1-F3, F4, F5-FF (never valid).
  // The UTF-8 encodings of any code-point range that starts and ends on block boundaries (all of
  // Unicode, all but a few ASCII characters) are unions of whole classes.
  static uint8_t utf8_class(uint8_t b);

 private:
  void build(std::vector<std::string> token_bytes, std::vector<int32_t> end_tokens,
             std::vector<bool> allowed);
  // Builds `trie` over strings[order[i]] (order sorted by string, then id).
  static void build_trie(const std::vector<std::string>& strings, const std::vector<int32_t>& order,
                         Trie* trie);
  // Sets every node's text_chars (parent[i]: node i's parent, -1 at depth 1).
  static void text_chars(Trie& trie, const std::vector<int32_t>& parent);

  int32_t num_tokens_ = 0;
  std::vector<uint32_t> offsets_;  // [num_tokens + 1] into bytes_
  std::string bytes_;
  std::vector<bool> in_trie_;
  std::vector<int32_t> end_tokens_;
  Trie byte_trie_;
  Trie class_trie_;
  std::vector<uint64_t> trie_mask_;
  std::vector<TokenText> token_text_;
  std::vector<int32_t> long_tokens_;
  static constexpr size_t kMaxTextKinds = 64;
  mutable std::mutex text_mu_;
  mutable std::vector<std::shared_ptr<const TextTokens>> text_kinds_;  // oldest first
  std::vector<uint32_t> byte_token_offsets_;                           // [257]
  std::vector<int32_t> byte_tokens_;
};

}  // namespace kiln::grammar
