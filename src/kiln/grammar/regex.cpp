#include "kiln/grammar/regex.h"

#include <algorithm>
#include <string>

#include <fmt/format.h>

#include "kiln/util/utf8.h"

namespace kiln::grammar {

namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

Ranges complement(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  uint32_t next = 0;
  for (auto [lo, hi] : r) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = std::max(next, hi + 1);
  }
  if (next <= kMaxCodepoint) out.emplace_back(next, kMaxCodepoint);
  return out;
}

const Ranges kDigit = {{'0', '9'}};
const Ranges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const Ranges kSpace = {{'\t', '\r'}, {' ', ' '}};

class RegexParser {
 public:
  RegexParser(std::string_view p, bool json) : s_(p), json_(json) {}

  Expected<RegexExpr> parse() {
    RegexExpr out;
    if (!s_.empty() && s_[0] == '^') {
      out.anchored_start = true;
      pos_ = 1;
    }
    size_t end = s_.size();
    if (end > pos_ && s_[end - 1] == '$') {
      size_t backslashes = 0;
      for (size_t i = end - 1; i > pos_ && s_[i - 1] == '\\'; --i) ++backslashes;
      if (backslashes % 2 == 0) {
        out.anchored_end = true;
        --end;
      }
    }
    s_ = s_.substr(0, end);
    Expr e;
    if (!parse_alt(&e)) return fail();
    if (pos_ < s_.size()) {
      error_ = s_[pos_] == ')' ? "unbalanced ')'" : "unexpected character";
      return fail();
    }
    out.expr = std::move(e);
    return out;
  }

 private:
  Error fail() const { return err("regex: {} at offset {}", error_, pos_); }
  bool error(std::string m) {
    error_ = std::move(m);
    return false;
  }
  bool at(char c) const { return pos_ < s_.size() && s_[pos_] == c; }

  Expr chars(Ranges r) const {
    return json_ ? json_string_chars(std::move(r)) : codepoints(std::move(r));
  }

  bool parse_alt(Expr* out) {
    std::vector<Expr> alts;
    while (true) {
      Expr e;
      if (!parse_concat(&e)) return false;
      alts.push_back(std::move(e));
      if (!at('|')) break;
      ++pos_;
    }
    *out = alt(std::move(alts));
    return true;
  }

  bool parse_concat(Expr* out) {
    std::vector<Expr> items;
    while (pos_ < s_.size() && !at('|') && !at(')')) {
      Expr atom;
      if (!parse_atom(&atom)) return false;
      if (!parse_quantifiers(&atom)) return false;
      items.push_back(std::move(atom));
    }
    *out = items.empty() ? empty() : seq(std::move(items));
    return true;
  }

  bool parse_int(int32_t* v) {
    const size_t b = pos_;
    int64_t x = 0;
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
      x = x * 10 + (s_[pos_++] - '0');
      if (x > 100000) return error("repetition count too large");
    }
    if (pos_ == b) return error("expected a number");
    *v = static_cast<int32_t>(x);
    return true;
  }

  bool parse_quantifiers(Expr* atom) {
    while (pos_ < s_.size()) {
      const char q = s_[pos_];
      int32_t lo, hi;
      if (q == '*') {
        lo = 0, hi = kUnbounded;
        ++pos_;
      } else if (q == '+') {
        lo = 1, hi = kUnbounded;
        ++pos_;
      } else if (q == '?') {
        lo = 0, hi = 1;
        ++pos_;
      } else if (q == '{') {
        ++pos_;
        if (!parse_int(&lo)) return false;
        hi = lo;
        if (at(',')) {
          ++pos_;
          if (at('}')) {
            hi = kUnbounded;
          } else if (!parse_int(&hi)) {
            return false;
          }
        }
        if (!at('}')) return error("expected '}'");
        ++pos_;
        if (hi != kUnbounded && hi < lo) return error("repetition {m,n} with n < m");
      } else {
        return true;
      }
      if (at('?') || at('+')) ++pos_;  // lazy / possessive: same language
      *atom = repeat(std::move(*atom), lo, hi);
    }
    return true;
  }

  bool hex(int digits, uint32_t* cp) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      if (pos_ >= s_.size()) return error("truncated escape");
      const char c = s_[pos_];
      int d;
      if (c >= '0' && c <= '9') {
        d = c - '0';
      } else if (c >= 'a' && c <= 'f') {
        d = c - 'a' + 10;
      } else if (c >= 'A' && c <= 'F') {
        d = c - 'A' + 10;
      } else {
        return error("bad hex digit");
      }
      ++pos_;
      v = v * 16 + static_cast<uint32_t>(d);
    }
    *cp = v;
    return true;
  }

  // After a backslash: a class escape (into *ranges) or one code point.
  bool parse_escape(Ranges* ranges) {
    if (pos_ >= s_.size()) return error("trailing backslash");
    const char e = s_[pos_++];
    uint32_t cp = 0;
    switch (e) {
      case 'd':
        *ranges = kDigit;
        return true;
      case 'D':
        *ranges = complement(kDigit);
        return true;
      case 'w':
        *ranges = kWord;
        return true;
      case 'W':
        *ranges = complement(kWord);
        return true;
      case 's':
        *ranges = kSpace;
        return true;
      case 'S':
        *ranges = complement(kSpace);
        return true;
      case 'n':
        cp = '\n';
        break;
      case 'r':
        cp = '\r';
        break;
      case 't':
        cp = '\t';
        break;
      case 'f':
        cp = '\f';
        break;
      case 'v':
        cp = '\v';
        break;
      case '0':
        cp = 0;
        break;
      case 'x':
        if (!hex(2, &cp)) return false;
        break;
      case 'u':
        if (!hex(4, &cp)) return false;
        break;
      default:
        if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '1' && e <= '9')) {
          --pos_;
          return error(fmt::format("unsupported escape '\\{}'", e));
        }
        cp = static_cast<uint8_t>(e);
    }
    *ranges = {{cp, cp}};
    return true;
  }

  bool parse_literal_cp(uint32_t* cp) {
    const utf8::Decoded d = utf8::decode(s_, pos_);
    if (d.num_bytes == 0) return error("invalid UTF-8");
    *cp = static_cast<uint32_t>(d.cp);
    pos_ += static_cast<size_t>(d.num_bytes);
    return true;
  }

  bool parse_class(Expr* out) {
    ++pos_;  // '['
    bool negated = false;
    if (at('^')) {
      negated = true;
      ++pos_;
    }
    Ranges all;
    bool first = true;
    while (pos_ < s_.size() && (!at(']') || first)) {
      first = false;
      Ranges one;
      if (at('\\')) {
        ++pos_;
        if (!parse_escape(&one)) return false;
      } else {
        uint32_t cp;
        if (!parse_literal_cp(&cp)) return false;
        one = {{cp, cp}};
      }
      if (one.size() == 1 && one[0].first == one[0].second && at('-') && pos_ + 1 < s_.size() &&
          s_[pos_ + 1] != ']') {
        ++pos_;
        Ranges hi;
        if (at('\\')) {
          ++pos_;
          if (!parse_escape(&hi)) return false;
        } else {
          uint32_t cp;
          if (!parse_literal_cp(&cp)) return false;
          hi = {{cp, cp}};
        }
        if (hi.size() != 1 || hi[0].first != hi[0].second) return error("bad class range");
        if (hi[0].first < one[0].first) return error("class range out of order");
        one[0].second = hi[0].first;
      }
      all.insert(all.end(), one.begin(), one.end());
    }
    if (!at(']')) return error("unterminated character class");
    ++pos_;
    *out = chars(negated ? complement(all) : all);
    return true;
  }

  bool parse_atom(Expr* out) {
    const char c = s_[pos_];
    if (c == '(') {
      ++pos_;
      if (at('?')) {
        ++pos_;
        if (at(':')) {
          ++pos_;
        } else if (at('P') && pos_ + 1 < s_.size() && s_[pos_ + 1] == '<') {
          pos_ = s_.find('>', pos_);
          if (pos_ == std::string_view::npos) return error("unterminated group name");
          ++pos_;
        } else if (at('<') && pos_ + 1 < s_.size() && s_[pos_ + 1] != '=' && s_[pos_ + 1] != '!') {
          pos_ = s_.find('>', pos_);
          if (pos_ == std::string_view::npos) return error("unterminated group name");
          ++pos_;
        } else {
          pos_ -= 2;
          return error("lookaround and inline flags are not supported");
        }
      }
      if (++depth_ > kMaxNesting) {
        return error(fmt::format("groups nested deeper than {} levels", kMaxNesting));
      }
      if (!parse_alt(out)) return false;
      --depth_;
      if (!at(')')) return error("expected ')'");
      ++pos_;
      return true;
    }
    if (c == '[') return parse_class(out);
    if (c == '.') {
      ++pos_;
      *out = chars(complement({{'\n', '\n'}}));
      return true;
    }
    if (c == '\\') {
      ++pos_;
      Ranges r;
      if (!parse_escape(&r)) return false;
      *out = chars(std::move(r));
      return true;
    }
    if (c == '^' || c == '$') return error("anchors are supported only at the ends");
    if (c == '*' || c == '+' || c == '?' || c == '{') return error("nothing to repeat");
    uint32_t cp;
    if (!parse_literal_cp(&cp)) return false;
    *out = chars({{cp, cp}});
    return true;
  }

  std::string_view s_;
  bool json_;
  size_t pos_ = 0;
  int depth_ = 0;  // groups open at pos_
  std::string error_;
};

std::string json_escape_of(uint32_t cp) {
  switch (cp) {
    case '"':
      return "\\\"";
    case '\\':
      return "\\\\";
    case '\n':
      return "\\n";
    case '\r':
      return "\\r";
    case '\t':
      return "\\t";
    case '\b':
      return "\\b";
    case '\f':
      return "\\f";
    default:
      return fmt::format("\\u{:04x}", cp);
  }
}

}  // namespace

Expr json_string_chars(Ranges ranges) {
  // Plain: everything but '"', '\' and U+0000..U+001F; those get their escape.
  Ranges plain;
  std::vector<Expr> alts;
  for (auto [lo, hi] : ranges) {
    for (uint32_t cp = lo; cp <= std::min<uint32_t>(hi, 0x5C); ++cp) {
      if (cp < 0x20 || cp == '"' || cp == '\\') alts.push_back(literal(json_escape_of(cp)));
    }
  }
  const Ranges specials = {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}};
  for (auto [lo, hi] : ranges) {
    uint32_t l = lo;
    for (auto [slo, shi] : specials) {
      if (shi < l || slo > hi) continue;
      if (slo > l) plain.emplace_back(l, slo - 1);
      l = shi + 1;
    }
    if (l <= hi) plain.emplace_back(l, hi);
  }
  if (!plain.empty()) alts.insert(alts.begin(), codepoints(std::move(plain)));
  if (alts.empty()) return codepoints({});  // matches nothing
  return alt(std::move(alts));
}

Expected<RegexExpr> parse_regex(std::string_view pattern, bool json_string) {
  return RegexParser(pattern, json_string).parse();
}

Expected<Grammar> compile_regex(std::string_view pattern) {
  auto r = parse_regex(pattern);
  if (!r.ok()) return std::move(r).take_error();
  GrammarBuilder b;
  const int32_t root = b.rule("root");
  b.define(root, std::move(r->expr));
  return b.build(root);
}

}  // namespace kiln::grammar
