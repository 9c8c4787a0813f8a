#include "kiln/grammar/grammar.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>

namespace kiln::grammar {

Expr empty() {
  return Expr{};
}

Expr literal(std::string_view bytes) {
  Expr e;
  e.kind = Expr::Kind::kSeq;
  for (char c : bytes) {
    ByteSet s;
    s.add(static_cast<uint8_t>(c));
    e.kids.push_back(byte_set(s));
  }
  return e;
}

Expr byte_set(const ByteSet& bytes) {
  Expr e;
  e.kind = Expr::Kind::kBytes;
  e.bytes = bytes;
  return e;
}

Expr codepoints(std::vector<std::pair<uint32_t, uint32_t>> ranges, bool negated) {
  std::sort(ranges.begin(), ranges.end());
  std::vector<std::pair<uint32_t, uint32_t>> merged;
  for (auto [lo, hi] : ranges) {
    if (lo > hi) continue;
    if (!merged.empty() && lo <= merged.back().second + 1) {
      merged.back().second = std::max(merged.back().second, hi);
    } else {
      merged.emplace_back(lo, hi);
    }
  }
  if (negated) {
    std::vector<std::pair<uint32_t, uint32_t>> inv;
    uint32_t next = 0;
    for (auto [lo, hi] : merged) {
      if (lo > next) inv.emplace_back(next, lo - 1);
      next = hi + 1;
    }
    if (next <= kMaxCodepoint) inv.emplace_back(next, kMaxCodepoint);
    merged = std::move(inv);
  }
  Expr e;
  e.kind = Expr::Kind::kCodepoints;
  e.ranges = std::move(merged);
  return e;
}

Expr token(std::string_view text) {
  Expr e;
  e.kind = Expr::Kind::kToken;
  e.text = std::string(text);
  return e;
}

Expr seq(std::vector<Expr> kids) {
  if (kids.size() == 1) return std::move(kids[0]);
  Expr e;
  e.kind = Expr::Kind::kSeq;
  e.kids = std::move(kids);
  return e;
}

Expr alt(std::vector<Expr> kids) {
  if (kids.size() == 1) return std::move(kids[0]);
  Expr e;
  e.kind = Expr::Kind::kAlt;
  e.kids = std::move(kids);
  return e;
}

Expr ref(int32_t rule) {
  Expr e;
  e.kind = Expr::Kind::kRef;
  e.rule = rule;
  return e;
}

Expr repeat(Expr x, int32_t min_count, int32_t max_count) {
  Expr e;
  e.kind = Expr::Kind::kRepeat;
  e.kids.push_back(std::move(x));
  e.min_count = min_count;
  e.max_count = max_count;
  return e;
}

// --- UTF-8 ----------------------------------------------------------------------------------

namespace {

int utf8_length(uint32_t cp) {
  return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
}

void encode_utf8(uint32_t cp, uint8_t* out) {
  switch (utf8_length(cp)) {
    case 1:
      out[0] = static_cast<uint8_t>(cp);
      break;
    case 2:
      out[0] = static_cast<uint8_t>(0xC0 | (cp >> 6));
      out[1] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
      break;
    case 3:
      out[0] = static_cast<uint8_t>(0xE0 | (cp >> 12));
      out[1] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F));
      out[2] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
      break;
    default:
      out[0] = static_cast<uint8_t>(0xF0 | (cp >> 18));
      out[1] = static_cast<uint8_t>(0x80 | ((cp >> 12) & 0x3F));
      out[2] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F));
      out[3] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
  }
}

// [lo, hi] have the same encoded length. Splits the range until, byte by byte, every
// combination of the per-byte ranges is a code point of the range (the classic construction
// of UTF-8 automata: split where a lower-order continuation byte does not span 80..BF).
void split_same_length(uint32_t lo, uint32_t hi,
                       std::vector<std::vector<std::pair<uint8_t, uint8_t>>>* out) {
  const int n = utf8_length(lo);
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (uint32_t{1} << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        split_same_length(lo, lo | m, out);
        split_same_length((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        split_same_length(lo, (hi & ~m) - 1, out);
        split_same_length(hi & ~m, hi, out);
        return;
      }
    }
  }
  uint8_t a[4], b[4];
  encode_utf8(lo, a);
  encode_utf8(hi, b);
  std::vector<std::pair<uint8_t, uint8_t>> s;
  for (int i = 0; i < n; ++i) s.emplace_back(a[i], b[i]);
  out->push_back(std::move(s));
}

}  // namespace

std::vector<std::vector<std::pair<uint8_t, uint8_t>>> utf8_sequences(uint32_t lo, uint32_t hi) {
  std::vector<std::vector<std::pair<uint8_t, uint8_t>>> out;
  hi = std::min(hi, kMaxCodepoint);
  // Pieces that do not cross an encoded-length boundary or the surrogates.
  const uint32_t bounds[][2] = {
      {0, 0x7F}, {0x80, 0x7FF}, {0x800, 0xD7FF}, {0xE000, 0xFFFF}, {0x10000, 0x10FFFF}};
  for (const auto& b : bounds) {
    const uint32_t l = std::max(lo, b[0]);
    const uint32_t h = std::min(hi, b[1]);
    if (l <= h) split_same_length(l, h, &out);
  }
  return out;
}

// --- Lowering -------------------------------------------------------------------------------

int32_t GrammarBuilder::rule(std::string_view name) {
  auto it = ids_.find(std::string(name));
  if (it != ids_.end()) return it->second;
  names_.emplace_back(name);
  exprs_.emplace_back();
  defined_.push_back(false);
  const int32_t id = static_cast<int32_t>(names_.size() - 1);
  ids_.emplace(names_.back(), id);
  return id;
}

int32_t GrammarBuilder::fresh_rule(std::string_view hint) {
  std::string name(hint);
  int32_t& n = next_suffix_[name];
  while (ids_.count(name)) name = fmt::format("{}-{}", hint, ++n);
  return rule(name);
}

void GrammarBuilder::define(int32_t r, Expr e) {
  exprs_[r] = std::move(e);
  defined_[r] = true;
}

namespace {

class Lowerer {
 public:
  explicit Lowerer(std::vector<std::string> names) {
    g_.rule_names = std::move(names);
    g_.rule_alts.resize(g_.rule_names.size());
  }

  void lower_rule(int32_t r, const Expr& e) {
    const std::string hint = g_.rule_names[r];  // a copy: new rules grow rule_names
    std::vector<std::vector<int32_t>> alts;
    if (e.kind == Expr::Kind::kAlt) {
      for (const Expr& k : e.kids) {
        alts.emplace_back();
        lower_seq(k, &alts.back(), hint);
      }
    } else {
      alts.emplace_back();
      lower_seq(e, &alts.back(), hint);
    }
    set_alts(r, alts);
  }

  Grammar take() { return std::move(g_); }
  // A repetition would have made the grammar larger than kMaxLoweredSize (lowering stopped
  // making repetitions at that point: the grammar taken is incomplete).
  bool too_large() const { return too_large_; }

 private:
  int32_t new_rule(const std::string& hint) {
    g_.rule_names.push_back(fmt::format("{}-{}", hint, helper_count_++));
    g_.rule_alts.emplace_back();
    return static_cast<int32_t>(g_.rule_alts.size() - 1);
  }

  void set_alts(int32_t r, const std::vector<std::vector<int32_t>>& alts) {
    for (const auto& a : alts) {
      g_.rule_alts[r].push_back(static_cast<int32_t>(g_.elements.size()));
      g_.elements.insert(g_.elements.end(), a.begin(), a.end());
      g_.elements.push_back(Grammar::kEnd);
    }
  }

  int32_t terminal(const ByteSet& s) {
    auto it = terminal_ids_.find(s.bits);
    if (it != terminal_ids_.end()) return it->second;
    const int32_t id = Grammar::kFirstTerminal - static_cast<int32_t>(g_.terminals.size());
    g_.terminals.push_back(s);
    g_.terminal_tokens.emplace_back();
    terminal_ids_.emplace(s.bits, id);
    return id;
  }

  int32_t token_terminal(const std::string& text) {
    auto it = token_ids_.find(text);
    if (it != token_ids_.end()) return it->second;
    const int32_t id = Grammar::kFirstTerminal - static_cast<int32_t>(g_.terminals.size());
    g_.terminals.emplace_back();
    g_.terminal_tokens.push_back(text);
    token_ids_.emplace(text, id);
    return id;
  }

  // One element standing for `e` (a terminal or a rule reference).
  int32_t element_for(const Expr& e, const std::string& hint) {
    if (e.kind == Expr::Kind::kBytes) return terminal(e.bytes);
    if (e.kind == Expr::Kind::kRef) return e.rule;
    std::vector<int32_t> one;
    lower_seq(e, &one, hint);
    if (one.size() == 1) return one[0];
    const int32_t r = new_rule(hint);
    set_alts(r, {one});
    return r;
  }

  void lower_codepoints(const Expr& e, std::vector<int32_t>* out, const std::string& hint) {
    auto cached = class_rules_.find(e.ranges);
    if (cached != class_rules_.end()) {
      out->push_back(cached->second);
      return;
    }
    ByteSet single;
    std::vector<std::vector<int32_t>> alts;
    for (auto [lo, hi] : e.ranges) {
      for (const auto& s : utf8_sequences(lo, hi)) {
        if (s.size() == 1) {
          single.add_range(s[0].first, s[0].second);
          continue;
        }
        std::vector<int32_t> a;
        for (auto [l, h] : s) {
          ByteSet b;
          b.add_range(l, h);
          a.push_back(terminal(b));
        }
        alts.push_back(std::move(a));
      }
    }
    if (alts.empty()) {
      if (single.empty()) {
        const int32_t r = new_rule(hint);  // no alternatives: matches nothing
        out->push_back(r);
        class_rules_.emplace(e.ranges, r);
        return;
      }
      out->push_back(terminal(single));
      return;
    }
    if (!single.empty()) alts.insert(alts.begin(), {terminal(single)});
    const int32_t r = new_rule(hint);
    set_alts(r, alts);
    class_rules_.emplace(e.ranges, r);
    out->push_back(r);
  }

  void lower_seq(const Expr& e, std::vector<int32_t>* out, const std::string& hint) {
    switch (e.kind) {
      case Expr::Kind::kEmpty:
        return;
      case Expr::Kind::kBytes:
        out->push_back(terminal(e.bytes));
        return;
      case Expr::Kind::kToken:
        out->push_back(token_terminal(e.text));
        return;
      case Expr::Kind::kCodepoints:
        lower_codepoints(e, out, hint);
        return;
      case Expr::Kind::kSeq:
        for (const Expr& k : e.kids) lower_seq(k, out, hint);
        return;
      case Expr::Kind::kRef:
        out->push_back(e.rule);
        return;
      case Expr::Kind::kAlt: {
        if (e.kids.size() == 1) {
          lower_seq(e.kids[0], out, hint);
          return;
        }
        const int32_t r = new_rule(hint);
        std::vector<std::vector<int32_t>> alts;
        for (const Expr& k : e.kids) {
          alts.emplace_back();
          lower_seq(k, &alts.back(), hint);
        }
        set_alts(r, alts);
        out->push_back(r);
        return;
      }
      case Expr::Kind::kRepeat: {
        if (e.max_count == 0 || too_large_) return;
        // What the loops below add: min_count elements, and a rule of up to three elements
        // (counted as four) per optional count.
        const int64_t num_optional =
            e.max_count == kUnbounded ? 1 : int64_t{e.max_count} - e.min_count;
        lowered_size_ += int64_t{e.min_count} + 4 * num_optional;
        if (lowered_size_ > kMaxLoweredSize) {
          too_large_ = true;
          return;
        }
        const int32_t item = element_for(e.kids[0], hint);
        for (int32_t i = 0; i < e.min_count; ++i) out->push_back(item);
        if (e.max_count == kUnbounded) {
          const int32_t r = new_rule(hint);  // r ::= item r | empty
          set_alts(r, {{item, r}, {}});
          out->push_back(r);
          return;
        }
        // r_k ::= item r_{k-1} | empty, with r_1 ::= item | empty.
        int32_t prev = -1;
        for (int32_t k = 1; k <= e.max_count - e.min_count; ++k) {
          const int32_t r = new_rule(hint);
          if (prev < 0) {
            set_alts(r, {{item}, {}});
          } else {
            set_alts(r, {{item, prev}, {}});
          }
          prev = r;
        }
        if (prev >= 0) out->push_back(prev);
        return;
      }
    }
  }

  Grammar g_;
  int64_t lowered_size_ = 0;  // what the repetitions lowered so far added (kMaxLoweredSize)
  bool too_large_ = false;
  int helper_count_ = 1;
  std::map<std::array<uint64_t, 4>, int32_t> terminal_ids_;
  std::map<std::string, int32_t> token_ids_;
  std::map<std::vector<std::pair<uint32_t, uint32_t>>, int32_t> class_rules_;
};

// Fails naming a rule that can reach itself without consuming a byte through a call that pushes
// a return position (left recursion the top-down automaton would expand forever).
Status check_left_recursion(const Grammar& g) {
  const int32_t n = g.num_rules();
  // Nullable rules by propagation (linear in the grammar's size: a fixed-point loop over the
  // rules takes a pass per link of a chain r1 ::= r2, r2 ::= r3 ... written in the wrong order).
  // pending[alt]: elements of the alternative not yet known nullable (alternatives with a
  // terminal are left out: they never are).
  std::vector<bool> nullable(n, false);
  std::vector<int32_t> alt_rule, pending;
  std::vector<std::vector<int32_t>> uses(n);  // per rule: the alternatives it stands in
  std::vector<int32_t> ready;                 // rules found nullable, to propagate
  for (int32_t r = 0; r < n; ++r) {
    for (int32_t a : g.rule_alts[r]) {
      bool has_terminal = false;
      for (int32_t p = a; g.elements[p] != Grammar::kEnd && !has_terminal; ++p) {
        has_terminal = Grammar::is_terminal(g.elements[p]);
      }
      if (has_terminal) continue;  // never nullable
      const auto alt = static_cast<int32_t>(alt_rule.size());
      int32_t count = 0;
      for (int32_t p = a; g.elements[p] != Grammar::kEnd; ++p, ++count) {
        uses[g.elements[p]].push_back(alt);
      }
      alt_rule.push_back(r);
      pending.push_back(count);
      if (count == 0 && !nullable[r]) {
        nullable[r] = true;
        ready.push_back(r);
      }
    }
  }
  while (!ready.empty()) {
    const int32_t r = ready.back();
    ready.pop_back();
    for (int32_t alt : uses[r]) {
      if (--pending[alt] == 0 && !nullable[alt_rule[alt]]) {
        nullable[alt_rule[alt]] = true;
        ready.push_back(alt_rule[alt]);
      }
    }
  }
  // The calls a rule can make before matching anything, and whether each is in tail position
  // (the last element of its alternative: expand() pushes no return position for it).
  struct Call {
    int32_t to;
    bool tail;
  };
  std::vector<std::vector<Call>> calls(n);
  for (int32_t r = 0; r < n; ++r) {
    for (int32_t a : g.rule_alts[r]) {
      for (int32_t p = a; g.elements[p] != Grammar::kEnd; ++p) {
        const int32_t el = g.elements[p];
        if (Grammar::is_terminal(el)) break;
        calls[r].push_back({el, g.elements[p + 1] == Grammar::kEnd});
        if (!nullable[el]) break;
      }
    }
  }
  // A cycle of such calls is left recursion the automaton cannot run only when one of its
  // calls is not in tail position (each pass pushes a return position: the stack grows without
  // end). A cycle of tail calls revisits the same stack, so x* of a nullable x (R ::= x R | "",
  // regex "(a*)*") runs. Cycles are the strongly connected components (Tarjan's algorithm,
  // iterative: grammars have up to a million rules).
  std::vector<int32_t> index(n, -1), low(n, 0), component(n, -1);
  std::vector<int32_t> open;  // Tarjan's stack
  std::vector<bool> is_open(n, false);
  std::vector<std::pair<int32_t, size_t>> dfs;  // (rule, next call to follow)
  int32_t next_index = 0, num_components = 0;
  auto visit = [&](int32_t r) {
    index[r] = low[r] = next_index++;
    open.push_back(r);
    is_open[r] = true;
    dfs.emplace_back(r, 0);
  };
  for (int32_t s = 0; s < n; ++s) {
    if (index[s] >= 0) continue;
    visit(s);
    while (!dfs.empty()) {
      const int32_t r = dfs.back().first;
      const size_t i = dfs.back().second++;
      if (i < calls[r].size()) {
        const int32_t t = calls[r][i].to;
        if (index[t] < 0) {
          visit(t);
        } else if (is_open[t]) {
          low[r] = std::min(low[r], index[t]);
        }
        continue;
      }
      if (low[r] == index[r]) {
        for (int32_t x = -1; x != r;) {
          x = open.back();
          open.pop_back();
          is_open[x] = false;
          component[x] = num_components;
        }
        ++num_components;
      }
      dfs.pop_back();
      if (!dfs.empty()) low[dfs.back().first] = std::min(low[dfs.back().first], low[r]);
    }
  }
  for (int32_t r = 0; r < n; ++r) {
    for (const Call& c : calls[r]) {
      if (c.tail || component[c.to] != component[r]) continue;
      return err(
          "grammar: rule '{}' is left-recursive (it calls '{}', which can reach '{}' again, "
          "before matching any character)",
          g.rule_names[r], g.rule_names[c.to], g.rule_names[r]);
    }
  }
  return {};
}

std::string byte_set_text(const ByteSet& s) {
  std::string out = "[";
  for (int b = 0; b < 256; ++b) {
    if (!s.has(static_cast<uint8_t>(b))) continue;
    int e = b;
    while (e + 1 < 256 && s.has(static_cast<uint8_t>(e + 1))) ++e;
    auto one = [](int c) {
      return (c >= 0x21 && c < 0x7F && c != '\\' && c != ']' && c != '-')
                 ? std::string(1, static_cast<char>(c))
                 : fmt::format("\\x{:02X}", c);
    };
    out += one(b);
    if (e > b) out += "-" + one(e);
    b = e;
  }
  return out + "]";
}

}  // namespace

Expected<Grammar> GrammarBuilder::build(int32_t root) const {
  for (size_t r = 0; r < names_.size(); ++r) {
    if (!defined_[r]) return err("grammar: rule '{}' is used but never defined", names_[r]);
  }
  Lowerer lw(names_);
  for (size_t r = 0; r < names_.size(); ++r) lw.lower_rule(static_cast<int32_t>(r), exprs_[r]);
  if (lw.too_large()) {
    return err(
        "grammar: too large once its repetitions are expanded (more than {} elements); use "
        "smaller repetition counts",
        kMaxLoweredSize);
  }
  Grammar g = lw.take();
  g.root = root;
  if (auto st = check_left_recursion(g); !st.ok()) return std::move(st).take_error();
  return g;
}

std::string Grammar::to_string() const {
  std::string out;
  for (int32_t r = 0; r < num_rules(); ++r) {
    out += rule_names[r] + " ::=";
    for (size_t i = 0; i < rule_alts[r].size(); ++i) {
      if (i) out += " |";
      for (int32_t p = rule_alts[r][i]; elements[p] != kEnd; ++p) {
        out += " ";
        if (!is_terminal(elements[p])) {
          out += rule_names[elements[p]];
        } else if (!terminal_token(elements[p]).empty()) {
          out += "<" + terminal_token(elements[p]) + ">";
        } else {
          out += byte_set_text(terminal(elements[p]));
        }
      }
      if (elements[rule_alts[r][i]] == kEnd) out += " \"\"";
    }
    out += "\n";
  }
  return out;
}

bool Grammar::has_token_terminals() const {
  return std::any_of(terminal_tokens.begin(), terminal_tokens.end(),
                     [](const std::string& t) { return !t.empty(); });
}

Grammar union_of(const Grammar& a, const Grammar& b) {
  Grammar g = a;
  const int32_t rule_shift = a.num_rules();
  const int32_t terminal_shift = static_cast<int32_t>(a.terminals.size());
  const int32_t pos_shift = static_cast<int32_t>(a.elements.size());
  for (int32_t el : b.elements) {
    if (el >= 0) {
      g.elements.push_back(el + rule_shift);
    } else if (Grammar::is_terminal(el)) {
      g.elements.push_back(el - terminal_shift);
    } else {
      g.elements.push_back(el);
    }
  }
  g.terminals.insert(g.terminals.end(), b.terminals.begin(), b.terminals.end());
  g.terminal_tokens.insert(g.terminal_tokens.end(), b.terminal_tokens.begin(),
                           b.terminal_tokens.end());
  for (int32_t r = 0; r < b.num_rules(); ++r) {
    std::vector<int32_t> alts = b.rule_alts[r];
    for (int32_t& p : alts) p += pos_shift;
    g.rule_alts.push_back(std::move(alts));
    g.rule_names.push_back("or-" + b.rule_names[r]);
  }
  // root ::= a.root | b.root
  const int32_t root = g.num_rules();
  g.rule_alts.emplace_back();
  for (int32_t r : {a.root, b.root + rule_shift}) {
    g.rule_alts.back().push_back(static_cast<int32_t>(g.elements.size()));
    g.elements.push_back(r);
    g.elements.push_back(Grammar::kEnd);
  }
  g.rule_names.push_back("either");
  g.root = root;
  return g;
}

}  // namespace kiln::grammar
