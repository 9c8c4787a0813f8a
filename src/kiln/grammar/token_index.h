// A vocabulary seen as bytes, for token masks: every token's bytes, and a byte trie of the
// tokens laid out in preorder, so that a walk can skip a whole subtree (every token that
// starts with a rejected prefix) by jumping to its end.
//
// Built once per tokenizer (about 100 ms for a 150k vocabulary) and shared by every grammar.
#pragma once

#include <cstdint>
#include <memory>
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
  // For tests: an explicit vocabulary; tokens with empty bytes are never allowed.
  static std::shared_ptr<const TokenIndex> create(std::vector<std::string> token_bytes,
                                                  std::vector<int32_t> end_tokens);

  int32_t num_tokens() const { return num_tokens_; }
  // Words of a token bitmask: ceil(num_tokens / 64).
  int32_t mask_words() const { return (num_tokens_ + 63) / 64; }
  std::string_view token_bytes(int32_t id) const;
  bool in_trie(int32_t id) const { return id >= 0 && id < num_tokens_ && in_trie_[id]; }
  std::span<const int32_t> end_tokens() const { return end_tokens_; }
  bool is_end_token(int32_t id) const;

  // The trie in preorder (the root is implicit: nodes at depth 1 start with one byte).
  struct Node {
    uint8_t byte;
    uint8_t pad;
    uint16_t depth;   // 1 for a first byte
    uint16_t height;  // longest path below this node, in bytes (0 for a leaf)
    uint16_t pad2;
    int32_t end;         // first node after this node's subtree
    int32_t tok_begin;   // tokens of this node, then of its subtree, in trie_tokens
    int32_t own_end;     // [tok_begin, own_end): tokens whose bytes end at this node
    int32_t tok_end;     // [own_end, tok_end): tokens strictly below this node
    int32_t desc_bytes;  // index in desc_sets: bytes of every node strictly below
  };
  std::span<const Node> nodes() const { return nodes_; }
  std::span<const int32_t> trie_tokens() const { return trie_tokens_; }
  const ByteSet& desc_set(int32_t i) const { return desc_sets_[i]; }
  int32_t max_depth() const { return max_depth_; }

 private:
  void build(std::vector<std::string> token_bytes, std::vector<int32_t> end_tokens,
             std::vector<bool> allowed);

  int32_t num_tokens_ = 0;
  std::vector<uint32_t> offsets_;  // [num_tokens + 1] into bytes_
  std::string bytes_;
  std::vector<bool> in_trie_;
  std::vector<int32_t> end_tokens_;
  std::vector<Node> nodes_;
  std::vector<int32_t> trie_tokens_;
  std::vector<ByteSet> desc_sets_;
  int32_t max_depth_ = 0;
};

}  // namespace kiln::grammar
