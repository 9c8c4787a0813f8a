#include "kiln/chat/jinja/lexer.h"

#include <cctype>
#include <cstring>

namespace kiln::chat::jinja {
namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

std::string rstrip_ws(const std::string& s) {
  size_t end = s.size();
  while (end > 0 && is_space(s[end - 1])) --end;
  return s.substr(0, end);
}

// Newlines normalized to \n and one trailing newline dropped, as Jinja2's lexer does.
std::string normalize_source(const std::string& src, bool keep_trailing_newline) {
  std::string out;
  out.reserve(src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i] == '\r') {
      out += '\n';
      if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
    } else {
      out += src[i];
    }
  }
  if (!keep_trailing_newline && !out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

class Lexer {
 public:
  Lexer(std::string src, const LexOptions& opts) : src_(std::move(src)), opts_(opts) {}

  Expected<std::vector<Token>> run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      size_t open = find_open(pos_);
      std::string text = src_.substr(pos_, open - pos_);
      if (open == src_.size()) {
        emit_text(text);
        pos_ = open;
        break;
      }
      char kind = src_[open + 1];  // '{', '%' or '#'
      char sign = open + 2 < src_.size() ? src_[open + 2] : '\0';
      bool has_sign = sign == '-' || sign == '+';
      if (sign == '-') {
        text = rstrip_ws(text);
      } else if (sign != '+' && opts_.lstrip_blocks && kind != '{') {
        size_t l_pos = text.rfind('\n');
        l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
        if (l_pos > 0 || line_starting) {
          bool all_ws = l_pos < text.size();
          for (size_t i = l_pos; i < text.size(); ++i) all_ws = all_ws && is_space(text[i]);
          if (all_ws) text.resize(l_pos);
        }
      }
      emit_text(text);
      line_ += count_newlines(pos_, open);
      pos_ = open + 2 + (has_sign ? 1 : 0);
      Status st;
      if (kind == '#') {
        st = lex_comment();
      } else if (kind == '%' && is_raw_tag()) {
        st = lex_raw();
      } else {
        st = lex_tag(kind == '%');
      }
      if (!st.ok()) return std::move(st).take_error();
      line_starting = pos_ > 0 && src_[pos_ - 1] == '\n';
    }
    tokens_.push_back({Tok::Eof, "", line_});
    return std::move(tokens_);
  }

 private:
  size_t find_open(size_t from) const {
    for (size_t i = from; i + 1 < src_.size(); ++i) {
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) {
        return i;
      }
    }
    return src_.size();
  }
  int count_newlines(size_t a, size_t b) const {
    int n = 0;
    for (size_t i = a; i < b && i < src_.size(); ++i) n += src_[i] == '\n';
    return n;
  }
  void emit_text(const std::string& text) {
    if (!text.empty()) tokens_.push_back({Tok::Text, text, line_});
  }
  void advance_to(size_t p) {
    line_ += count_newlines(pos_, p);
    pos_ = p;
  }
  // After a closing %} or #}: `-` eats all following whitespace, `+` nothing, and plain
  // trim_blocks one newline.
  void after_close(char sign, bool is_block) {
    if (sign == '-') {
      size_t p = pos_;
      while (p < src_.size() && is_space(src_[p])) ++p;
      advance_to(p);
    } else if (sign != '+' && is_block && opts_.trim_blocks && pos_ < src_.size() &&
               src_[pos_] == '\n') {
      advance_to(pos_ + 1);
    }
  }

  Status lex_comment() {
    size_t end = src_.find("#}", pos_);
    if (end == std::string::npos) return err("template line {}: unterminated comment", line_);
    char sign = end > pos_ && (src_[end - 1] == '-' || src_[end - 1] == '+') ? src_[end - 1] : 0;
    advance_to(end + 2);
    after_close(sign, true);
    return {};
  }

  // {% raw %} ... {% endraw %}: text kept verbatim.
  bool is_raw_tag() const {
    size_t p = pos_;
    while (p < src_.size() && is_space(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    while (p < src_.size() && is_space(src_[p])) ++p;
    if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) ++p;
    return src_.compare(p, 2, "%}") == 0;
  }
  Status lex_raw() {
    size_t close = src_.find("%}", pos_);
    char sign = src_[close - 1] == '-' || src_[close - 1] == '+' ? src_[close - 1] : 0;
    advance_to(close + 2);
    after_close(sign, true);
    for (size_t p = pos_; (p = src_.find("{%", p)) != std::string::npos; p += 2) {
      size_t q = p + 2;
      char lsign = q < src_.size() && (src_[q] == '-' || src_[q] == '+') ? src_[q] : 0;
      if (lsign) ++q;
      while (q < src_.size() && is_space(src_[q])) ++q;
      if (src_.compare(q, 6, "endraw") != 0) continue;
      q += 6;
      while (q < src_.size() && is_space(src_[q])) ++q;
      char rsign = q < src_.size() && (src_[q] == '-' || src_[q] == '+') ? src_[q] : 0;
      if (rsign) ++q;
      if (src_.compare(q, 2, "%}") != 0) continue;
      std::string text = src_.substr(pos_, p - pos_);
      if (lsign == '-') text = rstrip_ws(text);
      emit_text(text);
      advance_to(q + 2);
      after_close(rsign, true);
      return {};
    }
    return err("template line {}: missing endraw", line_);
  }

  Status lex_tag(bool is_block) {
    tokens_.push_back({is_block ? Tok::BlockBegin : Tok::VarBegin, "", line_});
    std::vector<char> balance;
    const char* close = is_block ? "%}" : "}}";
    while (true) {
      while (pos_ < src_.size() && is_space(src_[pos_])) advance_to(pos_ + 1);
      if (pos_ >= src_.size()) {
        return err("template line {}: unexpected end of template inside a tag", line_);
      }
      if (balance.empty()) {
        char sign = src_[pos_];
        if ((sign == '-' || sign == '+') && src_.compare(pos_ + 1, 2, close) == 0) {
          if (sign == '+' && !is_block) return err("template line {}: unexpected '+'", line_);
          tokens_.push_back({is_block ? Tok::BlockEnd : Tok::VarEnd, "", line_});
          pos_ += 3;
          after_close(sign, is_block);
          return {};
        }
        if (src_.compare(pos_, 2, close) == 0) {
          tokens_.push_back({is_block ? Tok::BlockEnd : Tok::VarEnd, "", line_});
          pos_ += 2;
          after_close(0, is_block);
          return {};
        }
      }
      KILN_TRY_STATUS(lex_one(balance));
    }
  }

  Status lex_one(std::vector<char>& balance) {
    char c = src_[pos_];
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t p = pos_;
      while (p < src_.size() &&
             (std::isalnum(static_cast<unsigned char>(src_[p])) || src_[p] == '_'))
        ++p;
      tokens_.push_back({Tok::Name, src_.substr(pos_, p - pos_), line_});
      pos_ = p;
      return {};
    }
    if (std::isdigit(static_cast<unsigned char>(c))) return lex_number();
    if (c == '\'' || c == '"') return lex_string(c);
    static const char* kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*",
                                 "/",  "%",  "~",  "<",  ">",  "=",  "(", ")", "[",
                                 "]",  "{",  "}",  ",",  ".",  ":",  "|", ";"};
    for (const char* op : kOps) {
      size_t n = std::strlen(op);
      if (src_.compare(pos_, n, op) != 0) continue;
      if (n == 1 && (c == '(' || c == '[' || c == '{')) balance.push_back(c);
      if (n == 1 && (c == ')' || c == ']' || c == '}')) {
        char want = c == ')' ? '(' : c == ']' ? '[' : '{';
        if (balance.empty() || balance.back() != want) {
          return err("template line {}: unexpected '{}'", line_, c);
        }
        balance.pop_back();
      }
      tokens_.push_back({Tok::Op, op, line_});
      pos_ += n;
      return {};
    }
    return err("template line {}: unexpected character '{}'", line_, c);
  }

  Status lex_number() {
    size_t p = pos_;
    auto digits = [&] {
      while (p < src_.size() &&
             (std::isdigit(static_cast<unsigned char>(src_[p])) || src_[p] == '_'))
        ++p;
    };
    digits();
    bool is_float = false;
    if (p + 1 < src_.size() && src_[p] == '.' &&
        std::isdigit(static_cast<unsigned char>(src_[p + 1]))) {
      is_float = true;
      ++p;
      digits();
    }
    if (p < src_.size() && (src_[p] == 'e' || src_[p] == 'E')) {
      size_t q = p + 1;
      if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
      if (q < src_.size() && std::isdigit(static_cast<unsigned char>(src_[q]))) {
        is_float = true;
        p = q;
        digits();
      }
    }
    std::string text;
    for (size_t i = pos_; i < p; ++i) {
      if (src_[i] != '_') text += src_[i];
    }
    tokens_.push_back({is_float ? Tok::Float : Tok::Int, text, line_});
    pos_ = p;
    return {};
  }

  static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }

  static void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xc0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xe0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else {
      out += static_cast<char>(0xf0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    }
  }

  Status lex_string(char quote) {
    int start_line = line_;
    std::string out;
    size_t p = pos_ + 1;
    while (p < src_.size() && src_[p] != quote) {
      char c = src_[p];
      if (c != '\\' || p + 1 >= src_.size()) {
        out += c;
        ++p;
        continue;
      }
      char e = src_[p + 1];
      p += 2;
      switch (e) {
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'r':
          out += '\r';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'v':
          out += '\v';
          break;
        case 'a':
          out += '\a';
          break;
        case '0':
          out += '\0';
          break;
        case '\\':
          out += '\\';
          break;
        case '\'':
          out += '\'';
          break;
        case '"':
          out += '"';
          break;
        case '\n':
          break;
        case 'x':
        case 'u':
        case 'U': {
          size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          if (p + n > src_.size()) return err("template line {}: bad escape in string", line_);
          uint32_t cp = 0;
          for (size_t k = 0; k < n; ++k) {
            int d = hex_digit(src_[p + k]);
            if (d < 0) return err("template line {}: bad escape in string", line_);
            cp = cp * 16 + static_cast<uint32_t>(d);
          }
          if (cp > 0x10ffff) return err("template line {}: bad escape in string", line_);
          append_utf8(out, cp);
          p += n;
          break;
        }
        default:
          out += '\\';
          out += e;
      }
    }
    if (p >= src_.size()) return err("template line {}: unterminated string", start_line);
    tokens_.push_back({Tok::String, out, start_line});
    advance_to(p + 1);
    return {};
  }

  std::string src_;
  LexOptions opts_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
};

}  // namespace

Expected<std::vector<Token>> lex(const std::string& source, const LexOptions& opts) {
  Lexer lexer(normalize_source(source, opts.keep_trailing_newline), opts);
  return lexer.run();
}

}  // namespace kiln::chat::jinja
