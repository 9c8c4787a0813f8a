#include "kiln/tokenizer/wordpiece.h"

#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>

#include "kiln/util/utf8.h"

namespace kiln::tokenizer::wordpiece {
namespace {

constexpr std::string_view kSpaceMark = "\xE2\x96\x81";  // U+2581 ▁, the phantom space

// Rust's char::is_whitespace (the Unicode White_Space property), as HF's BERT code uses it.
bool is_whitespace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

// HF's is_control: Unicode "Other" (Cc, Cf, Cn, Co, Cs) except tab, newline and return.
bool is_control(char32_t c) {
  if (c == '\t' || c == '\n' || c == '\r') return false;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CS:
      return true;
    default:
      return false;
  }
}

// The CJK Unified Ideographs blocks of HF's BertNormalizer (not Hangul, not kana).
bool is_chinese_char(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
         (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
         (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

// HF's is_bert_punc: ASCII punctuation (which includes symbols such as $ + < = > ^ ` | ~)
// or a Unicode punctuation category (Pc, Pd, Ps, Pe, Pi, Pf, Po).
bool is_punctuation(char32_t c) {
  if (c < 0x80) {
    return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) ||
           (c >= 0x7B && c <= 0x7E);
  }
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_PC:
    case UTF8PROC_CATEGORY_PD:
    case UTF8PROC_CATEGORY_PS:
    case UTF8PROC_CATEGORY_PE:
    case UTF8PROC_CATEGORY_PI:
    case UTF8PROC_CATEGORY_PF:
    case UTF8PROC_CATEGORY_PO:
      return true;
    default:
      return false;
  }
}

std::vector<char32_t> code_points(std::string_view s) {
  std::vector<char32_t> out;
  out.reserve(s.size());
  for (size_t pos = 0; pos < s.size();) {
    const utf8::Decoded d = utf8::decode(s, pos);
    if (d.num_bytes <= 0) {  // not reached: callers pass valid UTF-8
      out.push_back(0xFFFD);
      pos += static_cast<size_t>(std::max(1, d.maximal_subpart));
      continue;
    }
    out.push_back(d.cp);
    pos += static_cast<size_t>(d.num_bytes);
  }
  return out;
}

// NFD (canonical decomposition and ordering; Hangul syllables become jamo).
std::vector<char32_t> nfd(const std::vector<char32_t>& cps) {
  std::string s;
  for (char32_t c : cps) utf8::append(s, c);
  utf8proc_uint8_t* mapped = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(
      reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()),
      &mapped, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE));
  if (n < 0) return cps;  // only on invalid input, which code_points never yields
  std::vector<char32_t> out =
      code_points(std::string_view(reinterpret_cast<const char*>(mapped), static_cast<size_t>(n)));
  std::free(mapped);
  return out;
}

}  // namespace

std::string normalize(std::string_view text, const NormalizerOptions& opts) {
  std::vector<char32_t> cps = code_points(text);
  std::vector<char32_t> next;
  next.reserve(cps.size());
  if (opts.clean_text) {
    for (char32_t c : cps) {
      if (c == 0 || c == 0xFFFD || is_control(c)) continue;
      next.push_back(is_whitespace(c) ? U' ' : c);
    }
    cps.swap(next);
  }
  if (opts.handle_chinese_chars) {
    next.clear();
    for (char32_t c : cps) {
      if (is_chinese_char(c)) {
        next.insert(next.end(), {U' ', c, U' '});
      } else {
        next.push_back(c);
      }
    }
    cps.swap(next);
  }
  if (opts.strip_accents) {
    next.clear();
    for (char32_t c : nfd(cps)) {
      if (utf8proc_category(static_cast<utf8proc_int32_t>(c)) != UTF8PROC_CATEGORY_MN)
        next.push_back(c);
    }
    cps.swap(next);
  }
  std::string out;
  out.reserve(text.size());
  for (char32_t c : cps) {
    if (opts.lowercase) {
      // Rust's char::to_lowercase is the full mapping; the one code point whose lowercase
      // is longer than one is U+0130 (İ -> i + U+0307).
      if (c == 0x130) {
        out.append("i\xCC\x87");
        continue;
      }
      c = static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c)));
    }
    utf8::append(out, c);
  }
  return out;
}

void pre_tokenize(std::string_view text, std::vector<std::string_view>& words) {
  size_t start = 0;  // start of the word being read
  size_t pos = 0;
  while (pos < text.size()) {
    const utf8::Decoded d = utf8::decode(text, pos);
    const size_t len = static_cast<size_t>(std::max(1, d.num_bytes));
    const char32_t c = d.num_bytes > 0 ? d.cp : 0xFFFD;
    if (is_whitespace(c) || is_punctuation(c)) {
      if (pos > start) words.push_back(text.substr(start, pos - start));
      if (!is_whitespace(c)) words.push_back(text.substr(pos, len));
      start = pos + len;
    }
    pos += len;
  }
  if (pos > start) words.push_back(text.substr(start, pos - start));
}

void encode_word(std::string_view word,
                 const std::function<std::optional<int32_t>(std::string_view)>& lookup,
                 std::optional<int32_t> unk_id, std::vector<int32_t>& out) {
  // Character boundaries (byte offsets), the end included.
  std::vector<size_t> bounds;
  for (size_t pos = 0; pos < word.size();) {
    bounds.push_back(pos);
    pos += static_cast<size_t>(std::max(1, utf8::sequence_length(static_cast<uint8_t>(word[pos]))));
  }
  const size_t num_chars = bounds.size();
  bounds.push_back(word.size());
  auto unknown = [&] {
    if (unk_id) out.push_back(*unk_id);
  };
  if (num_chars > kMaxInputCharsPerWord) return unknown();
  const size_t first = out.size();
  std::string key;
  size_t start = 0;
  while (start < num_chars) {
    std::optional<int32_t> hit;
    size_t end = num_chars;
    for (; end > start; --end) {
      const std::string_view piece = word.substr(bounds[start], bounds[end] - bounds[start]);
      if (start == 0) {
        key.assign(kSpaceMark).append(piece);
        hit = lookup(key);
      } else {
        hit = lookup(piece);
      }
      if (hit) break;
    }
    if (!hit) {
      out.resize(first);
      return unknown();
    }
    out.push_back(*hit);
    start = end;
  }
}

std::string decode_piece(std::string_view token_text, bool is_special) {
  std::string piece;
  if (is_special) {
    piece.append(" ").append(token_text);
  } else if (token_text.starts_with(kSpaceMark)) {
    piece.append(" ").append(token_text.substr(kSpaceMark.size()));
  } else {
    piece.assign(token_text);
  }
  // tokenizers' decoders::wordpiece::cleanup, applied to each token's text.
  static constexpr std::pair<std::string_view, std::string_view> kCleanup[] = {
      {" .", "."},   {" ?", "?"},     {" !", "!"},    {" ,", ","},
      {" ' ", "'"},  {" n't", "n't"}, {" 'm", "'m"},  {" do not", " don't"},
      {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& [from, to] : kCleanup) {
    std::string next;
    size_t pos = 0;
    while (true) {
      const size_t hit = piece.find(from, pos);
      if (hit == std::string::npos) break;
      next.append(piece, pos, hit - pos).append(to);
      pos = hit + from.size();
    }
    next.append(piece, pos, std::string::npos);
    piece.swap(next);
  }
  return piece;
}

}  // namespace kiln::tokenizer::wordpiece
