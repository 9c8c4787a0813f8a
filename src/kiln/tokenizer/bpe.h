// The BPE merge loop shared by both model families: adjacent symbols merge in order of a
// pair priority (lowest first; ties go to the leftmost pair), with a priority queue of
// candidate pairs (O(n log n) per word, not the quadratic rescan).
//   byte-level / HF SentencePiece: priority = merge rank (tokenizers' BPE::merge_word).
//   llama.cpp SentencePiece without merges: priority = -score of the merged token.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace kiln::tokenizer::detail {

struct PairMerge {
  double priority = 0;
  int32_t merged = -1;  // id of the token the pair becomes
};

class PairTable {
 public:
  static uint64_t key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }
  // Keeps the first (best) entry for a pair.
  void add(int32_t left, int32_t right, PairMerge m) { map_.emplace(key(left, right), m); }
  const PairMerge* find(int32_t left, int32_t right) const {
    auto it = map_.find(key(left, right));
    return it == map_.end() ? nullptr : &it->second;
  }
  size_t size() const { return map_.size(); }
  void reserve(size_t n) { map_.reserve(n); }

 private:
  std::unordered_map<uint64_t, PairMerge> map_;
};

// One symbol of a word: a token id (-1: the text is not in the vocabulary and never
// merges) and its byte span in the word. prev/next link the live symbols (-1 at the ends).
struct Symbol {
  int32_t id = -1;
  uint32_t start = 0;
  uint32_t len = 0;
  int32_t prev = -1;
  int32_t next = -1;
};

// Merges `syms` in place (prev/next are set up here from the vector order). Afterwards the
// live symbols are syms[0], syms[syms[0].next], ... (a merge keeps its left symbol).
void merge_symbols(const PairTable& pairs, std::vector<Symbol>& syms);

}  // namespace kiln::tokenizer::detail
