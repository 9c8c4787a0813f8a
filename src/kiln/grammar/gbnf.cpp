#include "kiln/grammar/gbnf.h"

#include <map>
#include <string>
#include <unordered_map>

#include "kiln/util/utf8.h"

namespace kiln::grammar {

namespace {

class GbnfParser {
 public:
  explicit GbnfParser(std::string_view text) : s_(text) {}

  Expected<Grammar> parse() {
    skip_space(true);
    while (pos_ < s_.size()) {
      if (!parse_rule()) return fail();
      skip_space(true);
    }
    const int32_t root = find_rule("root");
    if (root < 0) return err("grammar: no 'root' rule");
    for (const auto& [rule, offset] : first_use_) {
      if (!b_.is_defined(rule)) {
        pos_ = offset;
        error_ = "rule '" + b_.name(rule) + "' is used but never defined";
        return fail();
      }
    }
    return b_.build(root);
  }

 private:
  Error fail() const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < error_pos() && i < s_.size(); ++i) {
      if (s_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    return err("grammar: line {} column {}: {}", line, col, error_);
  }
  size_t error_pos() const { return pos_; }
  bool error(std::string msg) {
    error_ = std::move(msg);
    return false;
  }

  int32_t find_rule(std::string_view name) {
    auto it = names_.find(std::string(name));
    return it == names_.end() ? -1 : it->second;
  }
  int32_t use_rule(const std::string& name, size_t offset) {
    int32_t r = find_rule(name);
    if (r < 0) {
      r = b_.rule(name);
      names_.emplace(name, r);
    }
    first_use_.emplace(r, offset);
    return r;
  }

  static bool is_word(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
  }

  void skip_space(bool newline_ok) {
    while (pos_ < s_.size()) {
      const char c = s_[pos_];
      if (c == ' ' || c == '\t') {
        ++pos_;
      } else if (c == '#') {
        while (pos_ < s_.size() && s_[pos_] != '\n') ++pos_;
      } else if (newline_ok && (c == '\n' || c == '\r')) {
        ++pos_;
      } else {
        break;
      }
    }
  }

  std::string parse_name() {
    const size_t b = pos_;
    while (pos_ < s_.size() && is_word(s_[pos_])) ++pos_;
    return std::string(s_.substr(b, pos_ - b));
  }

  bool parse_rule() {
    const size_t at = pos_;
    const std::string name = parse_name();
    if (name.empty()) return error("expected a rule name");
    skip_space(false);
    if (s_.substr(pos_, 3) != "::=") return error("expected '::=' after the rule name");
    pos_ += 3;
    skip_space(true);
    const int32_t r = use_rule(name, at);
    if (b_.is_defined(r)) {
      pos_ = at;
      return error("rule '" + name + "' is defined twice");
    }
    Expr e;
    if (!parse_alternatives(false, &e)) return false;
    b_.define(r, std::move(e));
    skip_space(false);
    if (pos_ < s_.size() && s_[pos_] != '\n' && s_[pos_] != '\r') {
      return error(std::string("unexpected '") + s_[pos_] + "'");
    }
    return true;
  }

  bool parse_alternatives(bool nested, Expr* out) {
    std::vector<Expr> alts;
    while (true) {
      Expr e;
      if (!parse_sequence(nested, &e)) return false;
      alts.push_back(std::move(e));
      if (pos_ < s_.size() && s_[pos_] == '|') {
        ++pos_;
        skip_space(true);
        continue;
      }
      break;
    }
    *out = alt(std::move(alts));
    return true;
  }

  bool parse_sequence(bool nested, Expr* out) {
    std::vector<Expr> items;
    while (pos_ < s_.size()) {
      const char c = s_[pos_];
      Expr item;
      if (c == '"') {
        const size_t open = pos_;
        ++pos_;
        std::string bytes;
        while (pos_ < s_.size() && s_[pos_] != '"') {
          uint32_t cp;
          if (!parse_char(&cp)) return false;
          utf8::append(bytes, static_cast<char32_t>(cp));
        }
        if (pos_ >= s_.size()) {
          pos_ = open;
          return error("unterminated literal");
        }
        ++pos_;
        item = literal(bytes);
      } else if (c == '[') {
        if (!parse_class(&item)) return false;
      } else if (c == '.') {
        ++pos_;
        item = codepoints({{0, kMaxCodepoint}});
      } else if (c == '(') {
        if (++depth_ > kMaxNesting) {
          return error("parentheses nested deeper than " + std::to_string(kMaxNesting) + " levels");
        }
        ++pos_;
        skip_space(true);
        if (!parse_alternatives(true, &item)) return false;
        --depth_;
        if (pos_ >= s_.size() || s_[pos_] != ')') return error("expected ')'");
        ++pos_;
      } else if (is_word(c)) {
        const size_t at = pos_;
        const std::string name = parse_name();
        // The next rule begins: `name ::=` (only at top level, after a newline was skipped).
        size_t p = pos_;
        while (p < s_.size() && (s_[p] == ' ' || s_[p] == '\t')) ++p;
        if (s_.substr(p, 3) == "::=") {
          pos_ = at;
          return error("expected a newline before the next rule");
        }
        item = ref(use_rule(name, at));
      } else {
        break;
      }
      skip_space(nested);
      // Postfix operators.
      while (pos_ < s_.size()) {
        const char q = s_[pos_];
        if (q == '*' || q == '+' || q == '?') {
          ++pos_;
          item = q == '*'   ? star(std::move(item))
                 : q == '+' ? plus(std::move(item))
                            : opt(std::move(item));
        } else if (q == '{') {
          int32_t lo = 0, hi = 0;
          if (!parse_braces(&lo, &hi)) return false;
          item = repeat(std::move(item), lo, hi);
        } else {
          break;
        }
        skip_space(nested);
      }
      items.push_back(std::move(item));
    }
    *out = items.empty() ? empty() : seq(std::move(items));
    return true;
  }

  bool parse_int(int32_t* v) {
    const size_t b = pos_;
    int64_t x = 0;
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
      x = x * 10 + (s_[pos_++] - '0');
      if (x > 100000) return error("repetition count too large (at most 100000)");
    }
    if (pos_ == b) return error("expected a number");
    *v = static_cast<int32_t>(x);
    return true;
  }

  bool parse_braces(int32_t* lo, int32_t* hi) {
    const size_t open = pos_;
    ++pos_;  // '{'
    skip_space(false);
    if (!parse_int(lo)) return false;
    skip_space(false);
    *hi = *lo;
    if (pos_ < s_.size() && s_[pos_] == ',') {
      ++pos_;
      skip_space(false);
      if (pos_ < s_.size() && s_[pos_] == '}') {
        *hi = kUnbounded;
      } else if (!parse_int(hi)) {
        return false;
      }
      skip_space(false);
    }
    if (pos_ >= s_.size() || s_[pos_] != '}') return error("expected '}'");
    ++pos_;
    if (*hi != kUnbounded && *hi < *lo) {
      pos_ = open;
      return error("repetition {m,n} with n < m");
    }
    return true;
  }

  bool hex(int digits, uint32_t* cp) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      if (pos_ >= s_.size()) return error("truncated escape");
      const char c = s_[pos_++];
      int d;
      if (c >= '0' && c <= '9') {
        d = c - '0';
      } else if (c >= 'a' && c <= 'f') {
        d = c - 'a' + 10;
      } else if (c >= 'A' && c <= 'F') {
        d = c - 'A' + 10;
      } else {
        --pos_;
        return error("bad hex digit in escape");
      }
      v = v * 16 + static_cast<uint32_t>(d);
    }
    *cp = v;
    return true;
  }

  // One character of a literal or class: an escape or a UTF-8 encoded code point.
  bool parse_char(uint32_t* cp) {
    if (s_[pos_] == '\\') {
      ++pos_;
      if (pos_ >= s_.size()) return error("truncated escape");
      const char e = s_[pos_++];
      switch (e) {
        case 'n':
          *cp = '\n';
          return true;
        case 'r':
          *cp = '\r';
          return true;
        case 't':
          *cp = '\t';
          return true;
        case 'x':
          return hex(2, cp);
        case 'u':
          return hex(4, cp);
        case 'U':
          return hex(8, cp);
        case '\\':
        case '"':
        case '\'':
        case '[':
        case ']':
        case '-':
        case '/':
        case '^':
          *cp = static_cast<uint32_t>(e);
          return true;
        default:
          --pos_;
          return error(std::string("unknown escape '\\") + e + "'");
      }
    }
    const utf8::Decoded d = utf8::decode(s_, pos_);
    if (d.num_bytes == 0) return error("invalid UTF-8");
    *cp = static_cast<uint32_t>(d.cp);
    pos_ += static_cast<size_t>(d.num_bytes);
    return true;
  }

  bool parse_class(Expr* out) {
    ++pos_;  // '['
    bool negated = false;
    if (pos_ < s_.size() && s_[pos_] == '^') {
      negated = true;
      ++pos_;
    }
    std::vector<std::pair<uint32_t, uint32_t>> ranges;
    while (pos_ < s_.size() && s_[pos_] != ']') {
      uint32_t lo, hi;
      if (!parse_char(&lo)) return false;
      hi = lo;
      if (pos_ + 1 < s_.size() && s_[pos_] == '-' && s_[pos_ + 1] != ']') {
        ++pos_;
        if (!parse_char(&hi)) return false;
        if (hi < lo) return error("character range out of order");
      }
      ranges.emplace_back(lo, hi);
    }
    if (pos_ >= s_.size()) return error("unterminated character class");
    ++pos_;
    *out = codepoints(std::move(ranges), negated);
    return true;
  }

  std::string_view s_;
  size_t pos_ = 0;
  int depth_ = 0;  // parentheses open at pos_
  std::string error_;
  GrammarBuilder b_;
  std::unordered_map<std::string, int32_t> names_;
  std::map<int32_t, size_t> first_use_;
};

}  // namespace

Expected<Grammar> parse_gbnf(std::string_view text) {
  return GbnfParser(text).parse();
}

}  // namespace kiln::grammar
