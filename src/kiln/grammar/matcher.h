// Running a grammar over bytes and tokens.
//
// The matcher is a pushdown automaton over the lowered grammar (grammar.h): a stack is a
// chain of grammar positions (the next element to match, then the return positions of the
// rules that called it); a state is the set of stacks the bytes so far leave alive (the
// grammar may be ambiguous). Stacks are hash-consed (a stack is a node: position + parent
// node), so equal stacks are one id and a state is a sorted vector of ids, itself interned.
// Transitions between states are computed on demand and remembered: the automaton becomes a
// DFA over stack sets built lazily, and walking it costs one table load per byte.
//
// Why a pushdown automaton and not an Earley parser: JSON Schema, regex and tool-call
// grammars are nearly deterministic, so the set of stacks stays at one or two; an Earley
// chart would carry items that this representation never creates, and its states are not as
// easy to intern. Left recursion, which a top-down automaton cannot run, is rejected at build
// time (GBNF in llama.cpp makes the same choice).
//
// Token masks (fill_mask), exact either way (docs/grammar.md):
//  - a state inside text (text_step: a JSON string, a format's body) takes the vocabulary's
//    text tokens of at most as many characters as its chain of text steps reads (masks kept per
//    kind of text in TokenIndex), and checks one by one the tokens that hold a byte the chain
//    accepts besides text ('"' and '\\' in a JSON string);
//  - any other state walks the vocabulary's trie (token_index.h) from the state, skipping every
//    subtree whose prefix is rejected and accepting whole every subtree whose paths all survive
//    (a self-loop on its bytes, a chain of states as deep as the subtree, valid UTF-8 text
//    along a chain of text steps).
// Masks that cost a long walk or many checks are remembered per compiled grammar, so a grammar
// reused (the LRU in cache.h) pays each once.
//
// Thread safety: a CompiledGrammar may be shared by matchers on several threads; its caches
// are guarded by a mutex.
#pragma once

#include <atomic>
#include <climits>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kiln/grammar/grammar.h"
#include "kiln/grammar/token_index.h"

namespace kiln::grammar {

// The lazily built automaton of one grammar. Not thread-safe by itself.
class Automaton {
 public:
  static constexpr int32_t kDead = 0;  // the empty set of stacks

  explicit Automaton(Grammar g);
  const Grammar& grammar() const { return g_; }

  int32_t initial() const { return initial_; }
  // The state after `byte` (kDead when no stack accepts it).
  int32_t step(int32_t state, uint8_t byte) {
    const int32_t* next = sets_[state].next.get();
    return next != nullptr && next[byte] >= 0 ? next[byte] : step_new(state, byte);
  }
  int32_t step(int32_t state, std::string_view bytes);
  // The state after the token terminal `terminal` (an element, Grammar::terminal_token), kDead
  // when no stack of `state` expects it.
  int32_t step_token(int32_t state, int32_t terminal);
  // The token terminals some stack of `state` expects (sorted elements; usually none).
  std::span<const int32_t> token_terminals(int32_t state) const {
    return sets_[state].token_terminals;
  }
  // Like step(state, bytes), where a token terminal of a state also reads its text (forced
  // text that holds a control token's text: a lazy grammar's trigger). The token terminal is
  // taken when the text follows; the grammar never offers the same text both ways.
  int32_t step_text(int32_t state, std::string_view bytes);
  // May the grammar end here (some stack is empty)?
  bool accepting(int32_t state) const { return sets_[state].accepting; }
  // Bytes some stack of `state` accepts.
  const ByteSet& first_bytes(int32_t state) const { return sets_[state].first; }
  // The successor that most bytes lead to from `state`, and those bytes (inside a JSON string:
  // the same state, or the next count of a bounded string).
  struct MainStep {
    int32_t next = kDead;
    ByteSet bytes;
  };
  const MainStep& main_step(int32_t state);
  // How `state` reads text: `next` is the state after one character, for the ASCII characters
  // in `ascii` and, when `multibyte`, for every valid multi-byte UTF-8 character (the states
  // inside a character accept exactly its valid continuation bytes). Inside a JSON string:
  // next == state (or the next count of a bounded string), ascii = printable ASCII but '"' and
  // '\\', multibyte = true.
  struct TextStep {
    int32_t next = kDead;
    bool multibyte = false;
    ByteSet ascii;
    // The bytes that begin a character: ascii, and the lead bytes C2-F4 when multibyte.
    ByteSet starts() const;
  };
  const TextStep& text_step(int32_t state);
  // Does `other` read characters as `t` does (same ascii and multibyte, not dead)?
  static bool same_text(const TextStep& t, const TextStep& other) {
    return other.next != kDead && other.multibyte == t.multibyte && other.ascii == t.ascii;
  }
  // A lower bound on how many characters `state` reads along its chain of text steps that keep
  // its ascii and multibyte (exact below kRunCap; kLongText: the chain loops).
  static constexpr int32_t kLongText = INT32_MAX;
  static constexpr int32_t kRunCap = 32;
  int32_t text_run(int32_t state);
  int32_t num_states() const { return static_cast<int32_t>(sets_.size()); }
  int32_t num_stacks() const { return static_cast<int32_t>(nodes_.size()); }

  // The memory an automaton's stacks may take (the stacks, and the states' lists of them,
  // counted roughly). An ambiguous grammar can keep more stacks alive at once than any request
  // should pay for ("(a{0,999}){0,999}" has a million after its first byte): past this the
  // automaton stops growing, and every transition it has not computed yet leads to kDead (the
  // output ends there; what it allowed so far was exact).
  static constexpr int64_t kMaxBytes = int64_t{64} << 20;
  bool exhausted() const { return exhausted_; }
  int64_t num_bytes() const { return num_bytes_; }
  // Roughly all the automaton holds: its stacks (num_bytes()), its states and their transition
  // tables, and the grammar (for caches that keep automata within a budget).
  int64_t memory_bytes() const;

 private:
  struct Node {
    int32_t pos;     // next element in g_.elements
    int32_t parent;  // the caller's stack (node 0: the empty stack)
  };
  struct Set {
    std::vector<int32_t> nodes;  // sorted; node 0 means "may end here"
    bool accepting = false;
    bool main_known = false;
    bool text_known = false;
    ByteSet first;
    std::vector<int32_t> token_terminals;                 // sorted, unique
    std::vector<std::pair<int32_t, int32_t>> token_next;  // (terminal, state) known
    MainStep main;
    TextStep text;
    int32_t text_run = -1;            // unknown
    std::unique_ptr<int32_t[]> next;  // [256], -1 unknown; allocated on the first step
  };
  struct VecHash {
    size_t operator()(const std::vector<int32_t>& v) const;
  };

  // step() where the transition is not known yet: computes and remembers it.
  int32_t step_new(int32_t state, uint8_t byte);
  int32_t node(int32_t pos, int32_t parent);
  // Adds the terminal-topped stacks reachable from `n` without consuming a byte.
  void expand(int32_t n, std::vector<int32_t>* out);
  int32_t intern(std::vector<int32_t> nodes);

  Grammar g_;
  std::vector<Node> nodes_;
  std::unordered_map<uint64_t, int32_t> node_ids_;
  std::vector<Set> sets_;
  std::unordered_map<std::vector<int32_t>, int32_t, VecHash> set_ids_;
  std::vector<uint32_t> stamp_;  // per node: visited in the current expansion
  uint32_t cur_stamp_ = 0;
  std::vector<int32_t> work_;
  int32_t initial_ = kDead;
  int64_t num_bytes_ = 0;        // roughly: nodes_, node_ids_, stamp_, the sets' lists of nodes
  bool exhausted_ = false;       // num_bytes_ passed kMaxBytes
  int64_t num_next_tables_ = 0;  // states with a transition table (Set::next)
};

// A grammar compiled for one vocabulary, with its caches. Shared by the matchers of every
// request that uses the same constraint.
class CompiledGrammar {
 public:
  CompiledGrammar(Grammar g, std::shared_ptr<const TokenIndex> vocab);
  // The constructor, failing when the grammar's first state alone exhausts its automaton
  // (Automaton::kMaxBytes: a grammar too ambiguous to run).
  static Expected<std::shared_ptr<CompiledGrammar>> create(Grammar g,
                                                           std::shared_ptr<const TokenIndex> vocab);
  const TokenIndex& vocab() const { return *vocab_; }
  const Grammar& grammar() const { return automaton_.grammar(); }
  // Whether masks walk the UTF-8 class trie (no terminal splits a class) or the byte trie.
  bool walks_class_trie() const { return trie_ == &vocab_->class_trie(); }
  // The automaton reached Automaton::kMaxBytes: transitions not computed before lead nowhere.
  bool exhausted() const { return exhausted_.load(std::memory_order_relaxed); }
  // Roughly what this grammar holds now: its automaton (Automaton::memory_bytes) and the masks
  // it remembers. Grows as matchers use it.
  int64_t memory_bytes() const { return memory_bytes_.load(std::memory_order_relaxed); }

 private:
  friend class Matcher;
  // Token ranges of the trie's token list (trie_->tokens), allowed and not allowed.
  struct WalkResult {
    std::vector<std::pair<int32_t, int32_t>> allowed, rejected;
    int64_t num_allowed = 0, num_rejected = 0, num_visited = 0;
    void clear() {
      allowed.clear();
      rejected.clear();
      num_allowed = num_rejected = num_visited = 0;
    }
  };
  // The vocabulary's tokens that are text as `t` reads it (kept per grammar as well).
  const std::shared_ptr<const TokenIndex::TextTokens>& text_tokens(const Automaton::TextStep& t);
  // Fills `mask` (vocab().mask_words() words) with the tokens allowed in `state`.
  void fill_mask(int32_t state, std::span<uint64_t> mask);
  // The mask of a state inside text (Automaton::text_step): the text tokens of at most the
  // chain's run of characters, and every token that holds an exit byte, each checked on the
  // automaton. False (mask untouched) where this does not apply; *num_checked: tokens checked.
  bool fill_text_mask(int32_t state, std::span<uint64_t> mask, int64_t* num_checked);
  // Keeps the mask of `state` when computing it cost more than kRememberAfterNodes (trie nodes
  // visited or tokens checked), within the memory budget.
  void remember(int32_t state, std::span<const uint64_t> mask, int64_t work);
  void walk(int32_t state, WalkResult* out);
  // Does `state` survive every string of `need` bytes, each byte from `bytes`? True when each
  // state on the way sends all of `bytes` to one successor that accepts them again.
  bool survives(int32_t state, const ByteSet& bytes, int32_t need);
  // Does `state` survive every valid UTF-8 path of at most `num_chars` characters whose bytes
  // are in `below`? (Automaton::text_step along the chain.)
  bool text_survives(int32_t state, const ByteSet& below, int32_t num_chars);

  std::mutex mu_;
  // Holds mu_ for work that may grow the automaton or the masks (a matcher's steps and mask
  // walks), and publishes what the grammar then holds before releasing it: exhausted() and
  // memory_bytes() read the copies without mu_, so the cache never waits on a mask walk.
  class GrowLock;
  std::atomic<bool> exhausted_{false};
  std::atomic<int64_t> memory_bytes_{0};
  Automaton automaton_;
  std::shared_ptr<const TokenIndex> vocab_;
  const TokenIndex::Trie* trie_;
  // Adds the tokens of the token terminals `state` expects.
  void add_token_terminals(int32_t state, std::span<uint64_t> mask);
  // A token terminal of `state` whose tokens hold `token`; 0 when none.
  int32_t token_terminal_for(int32_t state, int32_t token);

  std::unordered_map<int32_t, std::vector<uint64_t>> masks_;
  std::vector<std::vector<int32_t>> terminal_token_ids_;  // per terminal: token terminals' ids
  std::vector<int32_t> walk_states_;                      // per trie depth, scratch for walk()
  WalkResult walk_result_;                                // scratch for fill_mask()
  std::vector<std::shared_ptr<const TokenIndex::TextTokens>> text_tokens_;
  std::vector<int32_t> chain_;     // scratch for fill_text_mask()
  std::vector<uint64_t> checked_;  // scratch for fill_text_mask(): tokens already checked
  int64_t mask_bytes_ = 0;
};

// One constrained sequence: the state after the tokens accepted so far, and their history
// (rollback for speculative decoding and for tests).
class Matcher {
 public:
  explicit Matcher(std::shared_ptr<CompiledGrammar> grammar);

  // Allowed next tokens as a bitmask over the vocabulary: bit id of word id / 64. End tokens
  // are set exactly where the grammar may end. mask.size() >= mask_words().
  void fill_mask(std::span<uint64_t> mask);
  int32_t mask_words() const { return grammar_->vocab().mask_words(); }
  // Advances by one token; false (state unchanged) when the grammar does not allow it. An end
  // token is allowed only where the grammar may end, and finishes the matcher.
  bool accept_token(int32_t token);
  // Advances by raw bytes (forced text, tests); false (state unchanged) when not allowed. A
  // token terminal's text in `bytes` is read as that token (Automaton::step_text).
  bool accept_bytes(std::string_view bytes);
  // Undoes the last n accept_token / accept_bytes calls.
  void rollback(int32_t n);
  // May the output end here?
  bool can_end() const;
  bool finished() const { return finished_; }
  // No byte and no end is possible (a grammar that matches nothing).
  bool dead() const;
  // The grammar's automaton ran out of room (CompiledGrammar::exhausted): a dead end here may
  // be that, not the grammar.
  bool exhausted() const { return grammar_->exhausted(); }
  int32_t num_accepted() const { return static_cast<int32_t>(history_.size()); }
  void reset();

 private:
  std::shared_ptr<CompiledGrammar> grammar_;
  int32_t state_;
  bool finished_ = false;
  std::vector<std::pair<int32_t, bool>> history_;  // (state, finished) before each accept
};

// Does the mask allow any of the ids [0, n)?
bool any_allowed(std::span<const uint64_t> mask, size_t n);

// `logits` with every token the mask does not allow set to -inf, into `out` ([logits.size()];
// ids past the mask, such as padding rows of an output matrix, are never allowed). False when
// the mask allows nothing.
bool mask_logits(std::span<const float> logits, std::span<const uint64_t> mask,
                 std::vector<float>* out);

}  // namespace kiln::grammar
