#include "kiln/grammar/matcher.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>

namespace kiln::grammar {

// --- Automaton ------------------------------------------------------------------------------

size_t Automaton::VecHash::operator()(const std::vector<int32_t>& v) const {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ v.size();
  for (int32_t x : v) {
    h ^= static_cast<uint32_t>(x);
    h *= 0xFF51AFD7ED558CCDull;
    h ^= h >> 32;
  }
  return static_cast<size_t>(h);
}

Automaton::Automaton(Grammar g) : g_(std::move(g)) {
  nodes_.push_back({Grammar::kEnd, -1});  // node 0: the empty stack
  sets_.emplace_back();                   // set 0: dead
  set_ids_.emplace(std::vector<int32_t>{}, 0);
  // The root rule, called from the empty stack.
  std::vector<int32_t> out;
  ++cur_stamp_;
  for (int32_t a : g_.rule_alts[g_.root]) expand(node(a, 0), &out);
  if (exhausted_) return;  // initial_ stays kDead; CompiledGrammar::create reports it
  initial_ = intern(std::move(out));
}

namespace {
// Automaton::num_bytes_ counts a node (its entry in nodes_, in node_ids_ with the hash table's
// overhead, and in stamp_) and each stack in a state's list (the list and set_ids_'s key).
// States themselves are left out: their number grows with the output read (a{100000} has
// 100,000), which max_tokens bounds, not with a grammar's ambiguity.
constexpr int64_t kNodeBytes = sizeof(int32_t) * 2 + 48 + sizeof(uint32_t) * 2;
constexpr int64_t kSetEntryBytes = 2 * sizeof(int32_t);
}  // namespace

int64_t Automaton::memory_bytes() const {
  const auto count = [](size_t n) { return static_cast<int64_t>(n); };
  return num_bytes_ + count(sets_.size()) * count(sizeof(Set) + 64) +
         num_next_tables_ * count(256 * sizeof(int32_t)) +
         count(g_.elements.size() * sizeof(int32_t)) + count(g_.rule_alts.size()) * 64 +
         count(g_.terminals.size() * sizeof(ByteSet));
}

int32_t Automaton::node(int32_t pos, int32_t parent) {
  const uint64_t key =
      (static_cast<uint64_t>(static_cast<uint32_t>(pos)) << 32) | static_cast<uint32_t>(parent);
  auto [it, fresh] = node_ids_.emplace(key, static_cast<int32_t>(nodes_.size()));
  if (fresh) {
    nodes_.push_back({pos, parent});
    num_bytes_ += kNodeBytes;
    if (num_bytes_ > kMaxBytes) exhausted_ = true;
  }
  return it->second;
}

void Automaton::expand(int32_t start, std::vector<int32_t>* out) {
  work_.clear();
  work_.push_back(start);
  while (!work_.empty()) {
    if (exhausted_) {  // the caller drops `out`
      work_.clear();
      return;
    }
    const int32_t n = work_.back();
    work_.pop_back();
    if (stamp_.size() < nodes_.size()) stamp_.resize(nodes_.size() * 2, 0);
    if (stamp_[n] == cur_stamp_) continue;
    stamp_[n] = cur_stamp_;
    if (n == 0) {
      out->push_back(0);
      continue;
    }
    const Node nd = nodes_[n];
    const int32_t el = g_.elements[nd.pos];
    if (el == Grammar::kEnd) {
      work_.push_back(nd.parent);  // the rule is done: return to the caller
    } else if (Grammar::is_terminal(el)) {
      out->push_back(n);
    } else {
      // A call in tail position returns straight to our caller (no stack growth for x*).
      const int32_t cont =
          g_.elements[nd.pos + 1] == Grammar::kEnd ? nd.parent : node(nd.pos + 1, nd.parent);
      for (int32_t a : g_.rule_alts[el]) work_.push_back(node(a, cont));
    }
  }
}

int32_t Automaton::intern(std::vector<int32_t> nodes) {
  std::sort(nodes.begin(), nodes.end());
  nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
  auto it = set_ids_.find(nodes);
  if (it != set_ids_.end()) return it->second;
  Set s;
  s.accepting = !nodes.empty() && nodes[0] == 0;
  for (int32_t n : nodes) {
    if (n == 0) continue;
    const int32_t el = g_.elements[nodes_[n].pos];
    s.first |= g_.terminal(el);
    if (!g_.terminal_token(el).empty()) s.token_terminals.push_back(el);
  }
  std::sort(s.token_terminals.begin(), s.token_terminals.end());
  s.token_terminals.erase(std::unique(s.token_terminals.begin(), s.token_terminals.end()),
                          s.token_terminals.end());
  s.nodes = nodes;
  num_bytes_ += kSetEntryBytes * static_cast<int64_t>(nodes.size());
  if (num_bytes_ > kMaxBytes) exhausted_ = true;
  const int32_t id = static_cast<int32_t>(sets_.size());
  sets_.push_back(std::move(s));
  set_ids_.emplace(std::move(nodes), id);
  return id;
}

int32_t Automaton::step_new(int32_t state, uint8_t byte) {
  if (!sets_[state].first.has(byte) || exhausted_) return kDead;
  std::vector<int32_t> out;
  ++cur_stamp_;
  // Bytes that every stack of the set treats like `byte` lead to the same successor: fill the
  // whole class at once (a JSON string state has a handful of classes, not 256 bytes).
  ByteSet same;
  same.bits = {~0ull, ~0ull, ~0ull, ~0ull};
  // sets_ may grow below (node() does not touch it, intern() does, after the loop).
  for (int32_t n : sets_[state].nodes) {
    if (n == 0) continue;
    const Node nd = nodes_[n];
    const ByteSet& t = g_.terminal(g_.elements[nd.pos]);
    const bool hit = t.has(byte);
    for (int w = 0; w < 4; ++w) same.bits[w] &= hit ? t.bits[w] : ~t.bits[w];
    if (hit) expand(node(nd.pos + 1, nd.parent), &out);
  }
  if (exhausted_) return kDead;  // `out` may lack stacks: not a state
  const int32_t next = intern(std::move(out));
  Set& s2 = sets_[state];
  if (!s2.next) {
    s2.next.reset(new int32_t[256]);
    ++num_next_tables_;
    std::fill(s2.next.get(), s2.next.get() + 256, -1);
  }
  for (int w = 0; w < 4; ++w) {
    for (uint64_t bits = same.bits[w]; bits; bits &= bits - 1) {
      s2.next[w * 64 + std::countr_zero(bits)] = next;
    }
  }
  return next;
}

int32_t Automaton::step_token(int32_t state, int32_t terminal) {
  for (const auto& [t, next] : sets_[state].token_next) {
    if (t == terminal) return next;
  }
  const auto& terms = sets_[state].token_terminals;
  if (!std::binary_search(terms.begin(), terms.end(), terminal) || exhausted_) return kDead;
  std::vector<int32_t> out;
  ++cur_stamp_;
  const std::vector<int32_t> nodes = sets_[state].nodes;  // sets_ may grow in intern()
  for (int32_t n : nodes) {
    if (n == 0) continue;
    const Node nd = nodes_[n];
    if (g_.elements[nd.pos] == terminal) expand(node(nd.pos + 1, nd.parent), &out);
  }
  if (exhausted_) return kDead;
  const int32_t next = intern(std::move(out));
  sets_[state].token_next.emplace_back(terminal, next);
  return next;
}

int32_t Automaton::step_text(int32_t state, std::string_view bytes) {
  size_t i = 0;
  while (i < bytes.size() && state != kDead) {
    bool took = false;
    for (int32_t t : token_terminals(state)) {
      const std::string& text = g_.terminal_token(t);
      if (bytes.substr(i, text.size()) == text) {
        state = step_token(state, t);
        i += text.size();
        took = true;
        break;
      }
    }
    if (!took) state = step(state, static_cast<uint8_t>(bytes[i++]));
  }
  return state;
}

int32_t Automaton::step(int32_t state, std::string_view bytes) {
  for (char c : bytes) {
    state = step(state, static_cast<uint8_t>(c));
    if (state == kDead) return kDead;
  }
  return state;
}

const Automaton::MainStep& Automaton::main_step(int32_t state) {
  if (!sets_[state].main_known) {
    // The successor most bytes lead to, and those bytes.
    const ByteSet first = sets_[state].first;
    std::vector<std::pair<int32_t, int32_t>> counts;  // (successor, bytes)
    int32_t succ[256];
    for (int b = 0; b < 256; ++b) {
      succ[b] = first.has(static_cast<uint8_t>(b)) ? step(state, static_cast<uint8_t>(b)) : kDead;
      if (succ[b] == kDead) continue;
      auto it = std::find_if(counts.begin(), counts.end(),
                             [&](const auto& c) { return c.first == succ[b]; });
      if (it == counts.end()) {
        counts.emplace_back(succ[b], 1);
      } else {
        ++it->second;
      }
    }
    MainStep m;
    if (!counts.empty()) {
      m.next = std::max_element(counts.begin(), counts.end(), [](const auto& x, const auto& y) {
                 return x.second < y.second;
               })->first;
      for (int b = 0; b < 256; ++b) {
        if (succ[b] == m.next) m.bytes.add(static_cast<uint8_t>(b));
      }
    }
    sets_[state].main = m;
    sets_[state].main_known = true;
  }
  return sets_[state].main;
}

namespace {
// The UTF-8 encodings of every multi-byte character, as byte ranges per position (RFC 3629).
struct ByteRange {
  uint8_t lo, hi;
};
constexpr ByteRange kUtf8Forms[][4] = {
    {{0xC2, 0xDF}, {0x80, 0xBF}, {0, 0}, {0, 0}},
    {{0xE0, 0xE0}, {0xA0, 0xBF}, {0x80, 0xBF}, {0, 0}},
    {{0xE1, 0xEC}, {0x80, 0xBF}, {0x80, 0xBF}, {0, 0}},
    {{0xED, 0xED}, {0x80, 0x9F}, {0x80, 0xBF}, {0, 0}},
    {{0xEE, 0xEF}, {0x80, 0xBF}, {0x80, 0xBF}, {0, 0}},
    {{0xF0, 0xF0}, {0x90, 0xBF}, {0x80, 0xBF}, {0x80, 0xBF}},
    {{0xF1, 0xF3}, {0x80, 0xBF}, {0x80, 0xBF}, {0x80, 0xBF}},
    {{0xF4, 0xF4}, {0x80, 0x8F}, {0x80, 0xBF}, {0x80, 0xBF}},
};
}  // namespace

const Automaton::TextStep& Automaton::text_step(int32_t state) {
  if (sets_[state].text_known) return sets_[state].text;
  TextStep t;
  // Multi-byte characters: each byte of a form must lead every state on the way to one
  // successor, and every form to the same final state.
  int32_t mb_next = -1;
  bool mb = true;
  for (const auto& form : kUtf8Forms) {
    int32_t cur = state;
    for (int k = 0; k < 4 && form[k].lo != 0; ++k) {
      const ByteRange& r = form[k];
      if (k > 0) {
        // Inside the character: exactly the valid continuation bytes.
        ByteSet cont;
        cont.add_range(r.lo, r.hi);
        if (!(first_bytes(cur) == cont)) mb = false;
      }
      if (!mb) break;
      const int32_t to = step(cur, r.lo);
      for (int b = r.lo + 1; b <= r.hi && to != kDead; ++b) {
        if (step(cur, static_cast<uint8_t>(b)) != to) mb = false;
      }
      if (to == kDead) mb = false;
      if (!mb) break;
      cur = to;
    }
    if (!mb) break;
    if (mb_next != -1 && mb_next != cur) {
      mb = false;
      break;
    }
    mb_next = cur;
  }
  t.multibyte = mb;
  t.next = mb ? mb_next : main_step(state).next;
  if (t.next != kDead) {
    for (int b = 0; b < 0x80; ++b) {
      if (first_bytes(state).has(static_cast<uint8_t>(b)) &&
          step(state, static_cast<uint8_t>(b)) == t.next) {
        t.ascii.add(static_cast<uint8_t>(b));
      }
    }
  }
  sets_[state].text = t;
  sets_[state].text_known = true;
  return sets_[state].text;
}

ByteSet Automaton::TextStep::starts() const {
  ByteSet s = ascii;
  if (multibyte) s.add_range(0xC2, 0xF4);
  return s;
}

int32_t Automaton::text_run(int32_t state) {
  if (sets_[state].text_run >= 0) return sets_[state].text_run;
  // Follow the chain (at most kRunCap states) until a loop, a known run or a change of the
  // text step, then fill the runs backwards: exact where the chain ended, lower bounds where
  // the cap stopped it (a bounded string's chain is as long as its maxLength).
  constexpr int32_t kOnChain = -2;
  auto plus_one = [](int32_t run) { return run == kLongText ? kLongText : run + 1; };
  std::vector<int32_t> chain{state};
  sets_[state].text_run = kOnChain;
  int32_t run = 0;  // of chain.back()
  for (;;) {
    const int32_t s = chain.back();
    const TextStep t = text_step(s);  // a copy: sets_ may grow below
    if (t.next == kDead) {
      run = 0;
      break;
    }
    if (t.next == s || sets_[t.next].text_run == kOnChain) {
      run = kLongText;  // every state of the loop reads the same characters
      break;
    }
    if (!same_text(t, text_step(t.next)) || static_cast<int32_t>(chain.size()) >= kRunCap) {
      run = 1;  // one character for sure
      break;
    }
    if (sets_[t.next].text_run >= 0) {
      run = plus_one(sets_[t.next].text_run);
      break;
    }
    sets_[t.next].text_run = kOnChain;
    chain.push_back(t.next);
  }
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
    sets_[*it].text_run = run;
    run = plus_one(run);
  }
  return sets_[state].text_run;
}

// --- CompiledGrammar ------------------------------------------------------------------------

namespace {
// Masks are remembered for states whose walk visited more trie nodes than this (cheap walks
// are cheaper to redo than to store), up to a memory budget per compiled grammar.
constexpr int64_t kRememberAfterNodes = 512;
constexpr int64_t kMaskBudgetBytes = int64_t{64} << 20;
// A text state's mask checks at most this many tokens one by one (else the trie is walked).
constexpr size_t kMaxTextChecks = 8192;
}  // namespace

namespace {
// Does every terminal of `g` hold either all or none of the bytes of each UTF-8 class? Then
// every state treats the bytes of a class alike, and walking the class trie is exact.
bool respects_utf8_classes(const Grammar& g) {
  for (const ByteSet& t : g.terminals) {
    for (int b = 0x80; b < 256; ++b) {
      const uint8_t c = TokenIndex::utf8_class(static_cast<uint8_t>(b));
      if (t.has(static_cast<uint8_t>(b)) != t.has(c)) return false;
    }
  }
  return true;
}
}  // namespace

CompiledGrammar::CompiledGrammar(Grammar g, std::shared_ptr<const TokenIndex> vocab)
    : automaton_(std::move(g)), vocab_(std::move(vocab)) {
  trie_ =
      respects_utf8_classes(automaton_.grammar()) ? &vocab_->class_trie() : &vocab_->byte_trie();
  walk_states_.resize(trie_->max_depth + 1);
  const Grammar& lowered = automaton_.grammar();
  terminal_token_ids_.resize(lowered.terminals.size());
  for (size_t k = 0; k < lowered.terminals.size(); ++k) {
    if (!lowered.terminal_tokens[k].empty())
      terminal_token_ids_[k] = vocab_->tokens_with_text(lowered.terminal_tokens[k]);
  }
  exhausted_ = automaton_.exhausted();
  memory_bytes_ = automaton_.memory_bytes();
}

Expected<std::shared_ptr<CompiledGrammar>> CompiledGrammar::create(
    Grammar g, std::shared_ptr<const TokenIndex> vocab) {
  auto compiled = std::make_shared<CompiledGrammar>(std::move(g), std::move(vocab));
  if (compiled->exhausted()) {
    return err(
        "grammar: too ambiguous to run (its first position alone keeps more alternatives "
        "alive than {} MiB hold)",
        Automaton::kMaxBytes >> 20);
  }
  return compiled;
}

class CompiledGrammar::GrowLock {
 public:
  explicit GrowLock(CompiledGrammar& g) : g_(g), lock_(g.mu_) {}
  ~GrowLock() {  // runs before lock_ is released
    g_.exhausted_.store(g_.automaton_.exhausted(), std::memory_order_relaxed);
    g_.memory_bytes_.store(g_.automaton_.memory_bytes() + g_.mask_bytes_,
                           std::memory_order_relaxed);
  }
  GrowLock(const GrowLock&) = delete;
  GrowLock& operator=(const GrowLock&) = delete;

 private:
  CompiledGrammar& g_;
  std::lock_guard<std::mutex> lock_;
};

void CompiledGrammar::add_token_terminals(int32_t state, std::span<uint64_t> mask) {
  for (int32_t t : automaton_.token_terminals(state)) {
    for (int32_t id : terminal_token_ids_[Grammar::kFirstTerminal - t])
      mask[id >> 6] |= uint64_t{1} << (id & 63);
  }
}

int32_t CompiledGrammar::token_terminal_for(int32_t state, int32_t token) {
  for (int32_t t : automaton_.token_terminals(state)) {
    const std::vector<int32_t>& ids = terminal_token_ids_[Grammar::kFirstTerminal - t];
    if (std::binary_search(ids.begin(), ids.end(), token)) return t;
  }
  return 0;
}

void CompiledGrammar::walk(int32_t state, WalkResult* out) {
  const auto& nodes = trie_->nodes;
  auto accept = [&](int32_t b, int32_t e) {
    if (b == e) return;
    out->allowed.emplace_back(b, e);
    out->num_allowed += e - b;
  };
  auto reject = [&](int32_t b, int32_t e) {
    if (b == e) return;
    out->rejected.emplace_back(b, e);
    out->num_rejected += e - b;
  };
  int32_t* st = walk_states_.data();
  st[0] = state;
  const int32_t n = static_cast<int32_t>(nodes.size());
  int64_t visited = 0;
  for (int32_t i = 0; i < n;) {
    const TokenIndex::Node& nd = nodes[i];
    ++visited;
    const int32_t s = automaton_.step(st[nd.depth - 1], nd.byte);
    if (s == Automaton::kDead) {
      reject(nd.tok_begin, nd.tok_end);
      i = nd.end;
      continue;
    }
    accept(nd.tok_begin, nd.own_end);
    if (nd.own_end == nd.tok_end) {  // a leaf
      i = nd.end;
      continue;
    }
    // Cheap tests first: most subtrees hold a byte that kills or forks the state.
    const ByteSet& below = trie_->desc_set(nd);
    bool all = false;
    if (nd.text_chars != TokenIndex::kNotText) {
      // Valid UTF-8 text below: every path survives when each character reaches the next
      // state of a chain (inside a JSON string: the state itself) that reads them all.
      all = text_survives(s, below, nd.text_chars);
    }
    if (!all && automaton_.first_bytes(s).covers(below)) {
      const Automaton::MainStep& m = automaton_.main_step(s);
      if (m.bytes.covers(below)) {
        // A self-loop on every byte below (inside a JSON string), or a chain of states that
        // lasts as long as the deepest token below (inside a string with maxLength).
        all = m.next == s || survives(m.next, below, nd.height - 1);
      } else {
        all = nd.height <= 1;
      }
    }
    if (all) {
      accept(nd.own_end, nd.tok_end);  // every string below survives
      i = nd.end;
      continue;
    }
    st[nd.depth] = s;
    ++i;
  }
  out->num_visited = visited;
}

bool CompiledGrammar::text_survives(int32_t state, const ByteSet& below, int32_t num_chars) {
  ByteSet ascii = below;
  ascii.bits[2] = ascii.bits[3] = 0;
  const bool multibyte = (below.bits[2] | below.bits[3]) != 0;
  {
    const Automaton::TextStep& t = automaton_.text_step(state);
    if ((multibyte && !t.multibyte) || !t.ascii.covers(ascii)) return false;
    if (automaton_.text_run(state) >= num_chars) return true;
  }
  for (int32_t k = 0; k < num_chars; ++k) {
    const Automaton::TextStep& t = automaton_.text_step(state);
    if ((multibyte && !t.multibyte) || !t.ascii.covers(ascii)) return false;
    if (t.next == state) return true;  // a self-loop: survives any length
    state = t.next;
  }
  return true;
}

bool CompiledGrammar::survives(int32_t state, const ByteSet& bytes, int32_t need) {
  for (int32_t k = 0; k < need; ++k) {
    if (!automaton_.first_bytes(state).covers(bytes)) return false;
    if (k + 1 == need) return true;  // the last byte only has to be accepted
    const Automaton::MainStep& m = automaton_.main_step(state);
    if (!m.bytes.covers(bytes)) return false;
    if (m.next == state) return true;  // a self-loop: survives any length
    state = m.next;
  }
  return true;
}

const std::shared_ptr<const TokenIndex::TextTokens>& CompiledGrammar::text_tokens(
    const Automaton::TextStep& t) {
  for (const auto& tt : text_tokens_) {
    if (tt->ascii == t.ascii && tt->multibyte == t.multibyte) return tt;
  }
  text_tokens_.push_back(vocab_->text_tokens(t.ascii, t.multibyte));
  return text_tokens_.back();
}

bool CompiledGrammar::fill_text_mask(int32_t state, std::span<uint64_t> mask,
                                     int64_t* num_checked) {
  const Automaton::TextStep t = automaton_.text_step(state);
  // Worth it for free text (a JSON string, a format's body), not for a digit or two.
  const int num_ascii = std::popcount(t.ascii.bits[0]) + std::popcount(t.ascii.bits[1]);
  if (t.next == Automaton::kDead || (!t.multibyte && num_ascii < 8)) return false;
  // The chain of states that read text as `state` does, up to kUpTo characters: the bytes its
  // states accept besides text (exits), and how many characters it reads (run).
  constexpr int32_t kUpTo = TokenIndex::kTextUpTo;
  const ByteSet starts = t.starts();
  ByteSet exits;
  auto add_others = [&](int32_t s) {
    const ByteSet& f = automaton_.first_bytes(s);
    for (int w = 0; w < 4; ++w) exits.bits[w] |= f.bits[w] & ~starts.bits[w];
  };
  std::vector<int32_t>& chain = chain_;
  chain.assign(1, state);
  int32_t run = -1;  // -1: more than kUpTo characters, not known how many
  for (;;) {
    const int32_t s = chain.back();
    add_others(s);
    const int32_t next = automaton_.text_step(s).next;
    if (std::find(chain.begin(), chain.end(), next) != chain.end()) {
      run = Automaton::kLongText;  // a loop: any number of characters
      break;
    }
    if (!Automaton::same_text(t, automaton_.text_step(next))) {
      // The chain ends. Every byte `next` accepts is an exit, so longer text is checked one
      // token at a time; when `next` begins characters of the chain (a pattern's bounded run
      // followed by more text), that is most tokens: walk the trie instead.
      const ByteSet& f = automaton_.first_bytes(next);
      for (int w = 0; w < 4; ++w) {
        if (f.bits[w] & starts.bits[w]) return false;
      }
      exits |= f;
      run = static_cast<int32_t>(chain.size());
      break;
    }
    if (static_cast<int32_t>(chain.size()) > kUpTo) break;  // t_0..t_kUpTo read alike
    chain.push_back(next);
  }
  // Exits that many tokens hold (a space after a bounded run of letters): the trie walk is
  // cheaper than checking them one by one.
  size_t num_candidates = run >= 0 && run <= kUpTo ? 0 : vocab_->long_tokens().size();
  for (int w = 0; w < 4; ++w) {
    for (uint64_t bits = exits.bits[w]; bits != 0; bits &= bits - 1) {
      num_candidates += vocab_->tokens_with_byte(w * 64 + std::countr_zero(bits)).size();
    }
  }
  if (num_candidates > kMaxTextChecks) return false;
  const std::shared_ptr<const TokenIndex::TextTokens>& tt = text_tokens(t);
  const size_t words = static_cast<size_t>(vocab_->mask_words());
  checked_.assign(words, 0);
  int64_t n = 0;
  auto check = [&](int32_t id) {
    uint64_t& seen = checked_[id >> 6];
    const uint64_t bit = uint64_t{1} << (id & 63);
    if (seen & bit) return;
    seen |= bit;
    ++n;
    if (automaton_.step(state, vocab_->token_bytes(id)) != Automaton::kDead) {
      mask[id >> 6] |= bit;
    } else {
      mask[id >> 6] &= ~bit;
    }
  };
  // Text tokens of at most `run` characters are allowed; past the chain they die (above).
  if (run == Automaton::kLongText) {
    std::memcpy(mask.data(), tt->all.data(), words * sizeof(uint64_t));
  } else if (run >= 0 && run <= kUpTo) {
    std::memcpy(mask.data(), tt->up_to[run].data(), words * sizeof(uint64_t));
  } else {
    // At least kUpTo + 1 characters: the tokens of more than kUpTo are checked one by one.
    std::memcpy(mask.data(), tt->up_to[kUpTo].data(), words * sizeof(uint64_t));
    for (int32_t id : vocab_->long_tokens()) check(id);
  }
  // Any other token that survives holds an exit byte: check those one by one.
  for (int w = 0; w < 4; ++w) {
    for (uint64_t bits = exits.bits[w]; bits != 0; bits &= bits - 1) {
      const uint8_t b = static_cast<uint8_t>(w * 64 + std::countr_zero(bits));
      for (int32_t id : vocab_->tokens_with_byte(b)) check(id);
    }
  }
  *num_checked = n;
  return true;
}

void CompiledGrammar::fill_mask(int32_t state, std::span<uint64_t> mask) {
  const size_t words = static_cast<size_t>(vocab_->mask_words());
  auto it = masks_.find(state);
  if (it != masks_.end()) {
    std::memcpy(mask.data(), it->second.data(), words * sizeof(uint64_t));
    return;
  }
  int64_t num_checked = 0;
  if (state != Automaton::kDead && fill_text_mask(state, mask, &num_checked)) {
    if (automaton_.accepting(state)) {
      for (int32_t e : vocab_->end_tokens()) mask[e >> 6] |= uint64_t{1} << (e & 63);
    }
    add_token_terminals(state, mask);
    remember(state, mask, num_checked);
    return;
  }
  WalkResult& r = walk_result_;
  r.clear();
  if (state != Automaton::kDead) walk(state, &r);
  // Write the smaller side: most states of free text allow nearly every token.
  const std::vector<int32_t>& toks = trie_->tokens;
  if (state != Automaton::kDead && r.num_allowed > r.num_rejected) {
    std::memcpy(mask.data(), vocab_->trie_mask().data(), words * sizeof(uint64_t));
    for (const auto& [b, e] : r.rejected) {
      for (int32_t k = b; k < e; ++k) mask[toks[k] >> 6] &= ~(uint64_t{1} << (toks[k] & 63));
    }
  } else {
    std::fill(mask.begin(), mask.begin() + words, 0);
    for (const auto& [b, e] : r.allowed) {
      for (int32_t k = b; k < e; ++k) mask[toks[k] >> 6] |= uint64_t{1} << (toks[k] & 63);
    }
  }
  if (automaton_.accepting(state)) {
    for (int32_t e : vocab_->end_tokens()) mask[e >> 6] |= uint64_t{1} << (e & 63);
  }
  add_token_terminals(state, mask);
  remember(state, mask, r.num_visited);
}

void CompiledGrammar::remember(int32_t state, std::span<const uint64_t> mask, int64_t work) {
  const size_t words = static_cast<size_t>(vocab_->mask_words());
  const int64_t bytes = static_cast<int64_t>(words * sizeof(uint64_t));
  if (work > kRememberAfterNodes && mask_bytes_ + bytes <= kMaskBudgetBytes) {
    masks_.emplace(state, std::vector<uint64_t>(mask.begin(), mask.begin() + words));
    mask_bytes_ += bytes;
  }
}

// --- Matcher --------------------------------------------------------------------------------

Matcher::Matcher(std::shared_ptr<CompiledGrammar> grammar)
    : grammar_(std::move(grammar)), state_(grammar_->automaton_.initial()) {}

void Matcher::fill_mask(std::span<uint64_t> mask) {
  CompiledGrammar::GrowLock lock(*grammar_);
  if (finished_) {
    std::fill(mask.begin(), mask.begin() + mask_words(), 0);
    return;
  }
  grammar_->fill_mask(state_, mask);
}

bool Matcher::accept_token(int32_t token) {
  if (finished_) return false;
  const TokenIndex& v = grammar_->vocab();
  CompiledGrammar::GrowLock lock(*grammar_);
  if (v.is_end_token(token)) {
    if (!grammar_->automaton_.accepting(state_)) return false;
    history_.emplace_back(state_, finished_);
    finished_ = true;
    return true;
  }
  // A token a token terminal expects is that terminal (never its spelled-out text).
  if (const int32_t t = grammar_->token_terminal_for(state_, token); t != 0) {
    history_.emplace_back(state_, finished_);
    state_ = grammar_->automaton_.step_token(state_, t);
    return true;
  }
  if (!v.in_trie(token)) return false;
  const int32_t next = grammar_->automaton_.step(state_, v.token_bytes(token));
  if (next == Automaton::kDead) return false;
  history_.emplace_back(state_, finished_);
  state_ = next;
  return true;
}

bool Matcher::accept_bytes(std::string_view bytes) {
  if (finished_) return false;
  CompiledGrammar::GrowLock lock(*grammar_);
  const int32_t next = grammar_->automaton_.step_text(state_, bytes);
  if (next == Automaton::kDead) return false;
  history_.emplace_back(state_, finished_);
  state_ = next;
  return true;
}

void Matcher::rollback(int32_t n) {
  n = std::min<int32_t>(n, static_cast<int32_t>(history_.size()));
  for (int32_t i = 0; i < n; ++i) {
    state_ = history_.back().first;
    finished_ = history_.back().second;
    history_.pop_back();
  }
}

bool Matcher::can_end() const {
  std::lock_guard<std::mutex> lock(grammar_->mu_);
  return !finished_ && grammar_->automaton_.accepting(state_);
}

bool Matcher::dead() const {
  std::lock_guard<std::mutex> lock(grammar_->mu_);
  return !finished_ && grammar_->automaton_.first_bytes(state_).empty() &&
         grammar_->automaton_.token_terminals(state_).empty() &&
         !grammar_->automaton_.accepting(state_);
}

void Matcher::reset() {
  std::lock_guard<std::mutex> lock(grammar_->mu_);
  state_ = grammar_->automaton_.initial();
  finished_ = false;
  history_.clear();
}

bool any_allowed(std::span<const uint64_t> mask, size_t n) {
  for (size_t w = 0; w < mask.size() && w * 64 < n; ++w) {
    uint64_t bits = mask[w];
    if (n - w * 64 < 64) bits &= (uint64_t{1} << (n - w * 64)) - 1;
    if (bits != 0) return true;
  }
  return false;
}

bool mask_logits(std::span<const float> logits, std::span<const uint64_t> mask,
                 std::vector<float>* out) {
  const size_t n = logits.size();
  out->assign(n, -std::numeric_limits<float>::infinity());
  bool any = false;
  for (size_t w = 0; w < mask.size() && w * 64 < n; ++w) {
    for (uint64_t bits = mask[w]; bits; bits &= bits - 1) {
      const size_t id = w * 64 + static_cast<size_t>(std::countr_zero(bits));
      if (id >= n) break;
      (*out)[id] = logits[id];
      any = true;
    }
  }
  return any;
}

}  // namespace kiln::grammar
