// A context-free grammar over bytes: what every constraint (GBNF, JSON Schema, regex, choice)
// compiles to, and what the matcher (matcher.h) runs.
//
// Front ends build an expression tree (Expr: byte sets, code-point classes, sequences,
// alternatives, rule references, bounded or unbounded repetition) per named rule; build()
// lowers it to flat rules whose alternatives are sequences of elements, each a terminal (a
// set of bytes) or a rule reference. Code-point classes become alternatives of UTF-8 byte
// sequences (so "[^\"]" admits exactly the valid UTF-8 encodings of those code points), and
// repetitions become right-recursive helper rules (x* is R ::= x R | empty), which the matcher
// runs in constant stack depth (a reference in tail position pushes no return address).
//
// A token terminal (token()) matches one token of the vocabulary whose text is exactly the given
// string, usually a control token ([TOOL_CALLS], DeepSeek's call markers), which no sequence of
// text tokens can stand for: the mask allows that token and nothing spelled out. It reads no
// byte (its ByteSet is empty); the matcher steps it by token id (matcher.h).
//
// build() rejects left recursion (a rule that can reach itself before consuming a byte), since
// a top-down matcher would expand it forever, and names the rule.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kiln/util/status.h"

namespace kiln::grammar {

// A set of bytes (256 bits).
struct ByteSet {
  std::array<uint64_t, 4> bits{};
  void add(uint8_t b) { bits[b >> 6] |= uint64_t{1} << (b & 63); }
  void add_range(uint8_t lo, uint8_t hi) {
    for (int b = lo; b <= hi; ++b) add(static_cast<uint8_t>(b));
  }
  bool has(uint8_t b) const { return (bits[b >> 6] >> (b & 63)) & 1; }
  bool empty() const { return (bits[0] | bits[1] | bits[2] | bits[3]) == 0; }
  // Is every byte of `o` in this set?
  bool covers(const ByteSet& o) const {
    return ((o.bits[0] & ~bits[0]) | (o.bits[1] & ~bits[1]) | (o.bits[2] & ~bits[2]) |
            (o.bits[3] & ~bits[3])) == 0;
  }
  ByteSet& operator|=(const ByteSet& o) {
    for (int i = 0; i < 4; ++i) bits[i] |= o.bits[i];
    return *this;
  }
  bool operator==(const ByteSet& o) const = default;
};

// Largest Unicode code point.
inline constexpr uint32_t kMaxCodepoint = 0x10FFFF;
// "No upper bound" for Expr::max_count.
inline constexpr int32_t kUnbounded = -1;

// The most a grammar may lower to, counting each element and four per rule: what bounded
// repetitions expand to is the only part of a lowered grammar not proportional to its source
// (a 23-byte regex "(a{0,99999}){0,99999}" asks for 200,000 rules), so build() counts them
// before it makes them and fails past this (~16 MB of elements, or a million helper rules).
inline constexpr int64_t kMaxLoweredSize = int64_t{1} << 22;

// The deepest nesting of groups the front ends parse (regex and GBNF parentheses): their
// parsers, the lowering and Expr's destructor recurse once per level, and a request's
// "((((...a...))))" must not run its thread out of stack (50,000 levels did).
inline constexpr int kMaxNesting = 256;

struct Expr {
  enum class Kind : uint8_t {
    kEmpty,       // matches the empty string
    kBytes,       // one byte of `bytes`
    kCodepoints,  // one code point in `ranges` (UTF-8 encoded), surrogates excluded
    kSeq,         // kids in order
    kAlt,         // one of kids
    kRef,         // rule `rule`
    kRepeat,      // kids[0] repeated min_count..max_count times (max kUnbounded: no bound)
    kToken,       // one token whose text is `text` (a token terminal)
  };
  Kind kind = Kind::kEmpty;
  ByteSet bytes;
  std::vector<std::pair<uint32_t, uint32_t>> ranges;  // inclusive code-point ranges
  std::vector<Expr> kids;
  int32_t rule = -1;
  int32_t min_count = 0;
  int32_t max_count = 0;
  std::string text;  // kToken
};

// Expression helpers.
Expr empty();
Expr literal(std::string_view bytes);  // the bytes in order
Expr byte_set(const ByteSet& bytes);
// One code point in the inclusive ranges (negated: one not in them).
Expr codepoints(std::vector<std::pair<uint32_t, uint32_t>> ranges, bool negated = false);
Expr seq(std::vector<Expr> kids);
Expr alt(std::vector<Expr> kids);
Expr ref(int32_t rule);
Expr repeat(Expr e, int32_t min_count, int32_t max_count);
// A token terminal: one token whose text is `text` (text must not be empty).
Expr token(std::string_view text);
inline Expr opt(Expr e) {
  return repeat(std::move(e), 0, 1);
}
inline Expr star(Expr e) {
  return repeat(std::move(e), 0, kUnbounded);
}
inline Expr plus(Expr e) {
  return repeat(std::move(e), 1, kUnbounded);
}

// The lowered grammar. Elements are int32: >= 0 a reference to that rule, kEnd the end of an
// alternative, and <= kFirstTerminal a terminal: terminals[kFirstTerminal - element].
class Grammar {
 public:
  static constexpr int32_t kEnd = -1;
  static constexpr int32_t kFirstTerminal = -2;

  // Flat elements; every alternative is a run of elements ending with kEnd.
  std::vector<int32_t> elements;
  std::vector<ByteSet> terminals;
  // Per terminal: "" for a byte terminal, else the text of a token terminal (whose ByteSet is
  // empty: it reads no byte).
  std::vector<std::string> terminal_tokens;
  // rule_alts[r]: start positions (in elements) of rule r's alternatives.
  std::vector<std::vector<int32_t>> rule_alts;
  std::vector<std::string> rule_names;
  int32_t root = 0;

  static bool is_terminal(int32_t element) { return element <= kFirstTerminal; }
  const ByteSet& terminal(int32_t element) const { return terminals[kFirstTerminal - element]; }
  // The token text of a token terminal ("" for a byte terminal).
  const std::string& terminal_token(int32_t element) const {
    return terminal_tokens[kFirstTerminal - element];
  }
  bool has_token_terminals() const;
  int32_t num_rules() const { return static_cast<int32_t>(rule_alts.size()); }
  // GBNF-like text of the lowered rules (for debugging and tests).
  std::string to_string() const;
};

class GrammarBuilder {
 public:
  // The id of the rule named `name`, declaring it when new (define it later).
  int32_t rule(std::string_view name);
  // A fresh rule named after `hint` (hint, hint-1, hint-2...).
  int32_t fresh_rule(std::string_view hint);
  bool is_defined(int32_t rule) const { return defined_[rule]; }
  void define(int32_t rule, Expr e);
  const std::string& name(int32_t rule) const { return names_[rule]; }

  // Lowers every rule; fails naming a declared rule never defined, or a left-recursive rule,
  // or when the repetitions expand past kMaxLoweredSize.
  Expected<Grammar> build(int32_t root) const;

 private:
  std::vector<std::string> names_;
  std::vector<Expr> exprs_;
  std::vector<bool> defined_;
  std::unordered_map<std::string, int32_t> ids_;
  std::unordered_map<std::string, int32_t> next_suffix_;  // fresh_rule's last suffix per hint
};

// A grammar matching what `a` or `b` matches (their rules side by side under a new root).
Grammar union_of(const Grammar& a, const Grammar& b);

// The UTF-8 byte sequences of the code points in [lo, hi] (surrogates excluded): each result
// is a list of inclusive byte ranges, one per byte of the encoding.
std::vector<std::vector<std::pair<uint8_t, uint8_t>>> utf8_sequences(uint32_t lo, uint32_t hi);

}  // namespace kiln::grammar
