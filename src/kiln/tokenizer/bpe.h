// The BPE merge loop shared by both model families: adjacent symbols merge in order of a
// pair priority (lowest first; ties go to the leftmost pair), with a priority queue of
// candidate pairs (O(n log n) per word, not the quadratic rescan).
//   byte-level / HF SentencePiece: priority = merge rank (tokenizers' BPE::merge_word).
//   llama.cpp SentencePiece without merges: priority = -score of the merged token.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kiln::tokenizer::detail {

struct PairMerge {
  // Merge rank (exact in a float below 2^24) or -score; 16-byte table slots keep the
  // table small enough to stay mostly in cache.
  float priority = 0;
  int32_t merged = -1;  // id of the token the pair becomes
};

// Pair -> merge, as an open-addressing hash table (linear probing, power-of-two capacity):
// the merge loop does one lookup per candidate pair, and a node-based map's cache misses
// dominated the cost of encoding unseen words.
class PairTable {
 public:
  static uint64_t key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }
  // Keeps the first (best) entry for a pair. Ids must be >= 0.
  void add(int32_t left, int32_t right, PairMerge m);
  const PairMerge* find(int32_t left, int32_t right) const {
    if (slots_.empty()) return nullptr;
    const uint64_t k = key(left, right);
    for (size_t i = slot_of(k);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == k) return &s.merge;
      if (s.key == kEmpty) return nullptr;
    }
  }
  size_t size() const { return size_; }
  void reserve(size_t n);

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};  // key(-1, -1): never a real pair
  struct Slot {
    uint64_t key = kEmpty;
    PairMerge merge;
  };
  size_t slot_of(uint64_t k) const {
    return static_cast<size_t>((k * 0x9E3779B97F4A7C15ull) >> shift_);
  }
  void grow(size_t capacity);

  std::vector<Slot> slots_;
  size_t mask_ = 0;
  int shift_ = 64;
  size_t size_ = 0;
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
