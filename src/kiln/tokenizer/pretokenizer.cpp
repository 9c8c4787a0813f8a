#include "kiln/tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <array>
#include <mutex>

namespace kiln::tokenizer {
namespace {

// The regexes below are the Split patterns of the models' own tokenizer.json files.
constexpr std::string_view kLlama3 =
    R"(Split:(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2 =
    R"(Split:(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kTekken =
    R"(Split:[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kGpt4o =
    R"(Split:[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kDeepseekV3Words =
    R"(Split:[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kDeepseekLlmLetters =
    R"(Split:\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]++)";
// The GPT-2 regex ByteLevel applies when use_regex is true.
constexpr std::string_view kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

const std::vector<PreTokenizerSpec>& table() {
  static const std::vector<PreTokenizerSpec> specs = {
      {{"llama-bpe", "llama3", "llama-v3", "falcon3", "pixtral", "dbrx", "smaug-bpe"},
       {kLlama3, "ByteLevel"},
       /*ignore_merges=*/true,
       /*nfc=*/false,
       /*default_add_bos=*/true},
      {{"qwen2", "deepseek-r1-qwen"}, {kQwen2, "ByteLevel"}, false, true, false},
      {{"gpt-2", "phi-2", "mpt", "olmo", "jais", "roberta-bpe"},
       {"ByteLevel:regex"},
       false,
       false,
       false},
      {{"smollm", "starcoder", "refact", "codeshell"},
       {"Digits:individual", "ByteLevel:regex"},
       false,
       false,
       false},
      {{"tekken"}, {kTekken, "ByteLevel"}, true, false, true},
      {{"gpt-4o", "llama4"}, {kGpt4o, "ByteLevel"}, false, false, false},
      {{"deepseek-v3"},
       {R"(Split:\p{N}{1,3})", "Split:[一-龥぀-ゟ゠-ヿ]+", kDeepseekV3Words, "ByteLevel"},
       false,
       false,
       false},
      {{"deepseek-llm"},
       {"Split:[\\r\\n]", kDeepseekLlmLetters, R"(Split:\s?[!-/:-~！-／：-～‘-‟　-。]+)",
        R"(Split:\s+$)", "Split:[一-龥ࠀ-一가-퟿]+", R"(Split:\p{N}+)", "ByteLevel"},
       false,
       false,
       false},
      // llama.cpp's fallback for GGUFs that predate tokenizer.ggml.pre.
      {{"default"},
       {R"(Split:[\p{P}\$\+<=>\^~\|]+)",
        R"(Split:'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))",
        R"(Split:\p{N}+)", "Split:[0-9][0-9][0-9]"},
       false,
       false,
       false},
  };
  return specs;
}

// Unicode White_Space (what Oniguruma's \s means for a UTF-8 subject, and what
// tokenizers.js rewrites \s to), as the body of a PCRE2 character class.
constexpr std::string_view kWhiteSpaceBody =
    "\\x{9}-\\x{d}\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}"
    "\\x{202f}\\x{205f}\\x{3000}";

bool is_ascii_letter(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
char lower(char c) {
  return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
}
char upper(char c) {
  return c >= 'a' && c <= 'z' ? static_cast<char>(c - 'a' + 'A') : c;
}

// Copies a braced escape body ("{L}") starting at p[i] == '{'; returns the index after it.
Expected<size_t> copy_braced(std::string_view p, size_t i, std::string& out) {
  const size_t close = p.find('}', i);
  if (close == std::string_view::npos) return err("regex '{}': unterminated \\p{{ or \\x{{", p);
  out.append(p.substr(i, close + 1 - i));
  return close + 1;
}

// Translates one escape (p[i] == '\\'). `in_class`: inside [...], where \s is a body.
Expected<size_t> translate_escape(std::string_view p, size_t i, bool in_class, std::string& out) {
  if (i + 1 >= p.size()) return err("regex '{}': trailing backslash", p);
  const char n = p[i + 1];
  switch (n) {
    case 's':
      if (in_class) {
        out.append(kWhiteSpaceBody);
      } else {
        out.append("[").append(kWhiteSpaceBody).append("]");
      }
      return i + 2;
    case 'S':
      if (in_class) return err("regex '{}': \\S inside a class is not supported", p);
      out.append("[^").append(kWhiteSpaceBody).append("]");
      return i + 2;
    case 'd':
      out.append("\\p{Nd}");
      return i + 2;
    case 'D':
      if (in_class) return err("regex '{}': \\D inside a class is not supported", p);
      out.append("\\P{Nd}");
      return i + 2;
    case 'w':
    case 'W':
    case 'b':
    case 'B':
    case 'G':
    case 'h':
    case 'H':
    case 'A':
    case 'z':
    case 'Z':
      return err("regex '{}': escape \\{} is not supported by kiln's translator", p, n);
    case 'p':
    case 'P':
    case 'x':
      if (i + 2 < p.size() && p[i + 2] == '{') {
        out.append(p.substr(i, 2));
        return copy_braced(p, i + 2, out);
      }
      break;
    default:
      break;
  }
  out.push_back('\\');
  out.push_back(n);
  return i + 2;
}

// Translates a character class starting at p[i] == '['; returns the index after its ']'.
Expected<size_t> translate_class(std::string_view p, size_t i, bool fold, std::string& out) {
  out.push_back('[');
  ++i;
  if (i < p.size() && p[i] == '^') {
    out.push_back('^');
    ++i;
  }
  bool first = true;
  while (i < p.size()) {
    const char c = p[i];
    if (c == ']' && !first) {
      out.push_back(']');
      return i + 1;
    }
    first = false;
    if (c == '\\') {
      KILN_TRY(i, translate_escape(p, i, /*in_class=*/true, out));
      continue;
    }
    if (c == '[') return err("regex '{}': nested character classes are not supported", p);
    if (fold && is_ascii_letter(c)) {
      if (i + 1 < p.size() && p[i + 1] == '-') {
        return err("regex '{}': a range inside (?i:...) is not supported", p);
      }
      out.push_back(lower(c));
      out.push_back(upper(c));
      ++i;
      continue;
    }
    out.push_back(c);
    ++i;
  }
  return err("regex '{}': unterminated character class", p);
}

}  // namespace

const PreTokenizerSpec* find_pre_tokenizer(std::string_view name) {
  for (const PreTokenizerSpec& spec : table()) {
    for (std::string_view n : spec.names) {
      if (n == name) return &spec;
    }
  }
  return nullptr;
}

std::span<const PreTokenizerSpec> known_pre_tokenizers() {
  return table();
}

Expected<std::string> oniguruma_to_pcre2(std::string_view p) {
  std::string out;
  out.reserve(p.size() * 2);
  bool fold = false;
  std::vector<bool> fold_stack;
  size_t i = 0;
  while (i < p.size()) {
    const char c = p[i];
    if (c == '\\') {
      KILN_TRY(i, translate_escape(p, i, /*in_class=*/false, out));
      continue;
    }
    if (c == '[') {
      KILN_TRY(i, translate_class(p, i, fold, out));
      continue;
    }
    if (c == '(') {
      fold_stack.push_back(fold);
      if (p.substr(i).starts_with("(?i:")) {
        fold = true;
        out.append("(?:");
        i += 4;
        continue;
      }
      if (p.substr(i).starts_with("(?") && !p.substr(i).starts_with("(?:") &&
          !p.substr(i).starts_with("(?=") && !p.substr(i).starts_with("(?!") &&
          !p.substr(i).starts_with("(?<=") && !p.substr(i).starts_with("(?<!") &&
          !p.substr(i).starts_with("(?>")) {
        return err("regex '{}': group syntax at offset {} is not supported", p, i);
      }
      out.push_back('(');
      ++i;
      continue;
    }
    if (c == ')') {
      if (fold_stack.empty()) return err("regex '{}': unbalanced ')'", p);
      fold = fold_stack.back();
      fold_stack.pop_back();
      out.push_back(')');
      ++i;
      continue;
    }
    if (c == '$') {
      out.append("(?=\\n|\\z)");
    } else if (c == '^') {
      out.append("(?:(?<=\\n)|\\A)");
    } else if (c == '.') {
      out.append("[^\\n]");
    } else if (fold && is_ascii_letter(c)) {
      out.push_back('[');
      out.push_back(lower(c));
      out.push_back(upper(c));
      out.push_back(']');
    } else {
      out.push_back(c);
    }
    ++i;
  }
  if (!fold_stack.empty()) return err("regex '{}': unbalanced '('", p);
  return out;
}

struct PreTokenizer::Compiled {
  std::vector<pcre2_code*> codes;
  ~Compiled() {
    for (pcre2_code* c : codes) pcre2_code_free(c);
  }
};

namespace {

Expected<pcre2_code*> compile_regex(std::string_view onig) {
  KILN_TRY(std::string pattern, oniguruma_to_pcre2(onig));
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF, &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    std::array<PCRE2_UCHAR, 256> msg{};
    pcre2_get_error_message(error_code, msg.data(), msg.size());
    return err("pre-tokenizer regex '{}' does not compile in PCRE2 at offset {}: {}", onig,
               error_offset, reinterpret_cast<const char*>(msg.data()));
  }
  // JIT is an optimisation: pcre2_match falls back to the interpreter without it.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return code;
}

// Splits every span in `in` by one regex, keeping matches and the gaps between them
// (tokenizers' SplitDelimiterBehavior::Isolated).
Status split_by(const pcre2_code* code, const std::vector<std::string_view>& in,
                std::vector<std::string_view>& out, pcre2_match_data* md,
                pcre2_match_context* mctx) {
  for (std::string_view s : in) {
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
    size_t offset = 0;
    size_t last = 0;
    while (offset < s.size()) {
      const int rc = pcre2_match(code, subject, s.size(), offset, PCRE2_NO_UTF_CHECK, md, mctx);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        std::array<PCRE2_UCHAR, 256> msg{};
        pcre2_get_error_message(rc, msg.data(), msg.size());
        return err("pre-tokenizer regex failed on a {}-byte piece: {}", s.size(),
                   reinterpret_cast<const char*>(msg.data()));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      const size_t start = ov[0];
      const size_t end = ov[1];
      if (end > start) {
        if (start > last) out.push_back(s.substr(last, start - last));
        out.push_back(s.substr(start, end - start));
        last = end;
        offset = end;
      } else {
        // An empty match: step one code point, as JavaScript's matchAll does in u mode.
        offset = end + 1;
        while (offset < s.size() && (static_cast<uint8_t>(s[offset]) & 0xC0) == 0x80) ++offset;
      }
    }
    if (last < s.size()) out.push_back(s.substr(last));
  }
  return {};
}

}  // namespace

Expected<PreTokenizer> PreTokenizer::create(const PreTokenizerSpec& spec) {
  auto compiled = std::make_shared<Compiled>();
  for (std::string_view step : spec.signature) {
    std::string_view regex;
    if (step.starts_with("Split:")) {
      regex = step.substr(6);
    } else if (step == "Digits:individual") {
      regex = R"(\p{N})";
    } else if (step == "Digits") {
      regex = R"(\p{N}+)";
    } else if (step == "ByteLevel:regex") {
      regex = kGpt2Regex;
    } else if (step == "ByteLevel") {
      continue;  // byte mapping only; no split
    } else {
      return err("pre-tokenizer '{}': unknown step '{}'", spec.names.front(), step);
    }
    KILN_TRY(pcre2_code * code, compile_regex(regex));
    compiled->codes.push_back(code);
  }
  PreTokenizer p;
  p.compiled_ = std::move(compiled);
  return p;
}

Status PreTokenizer::split(std::string_view text, std::vector<std::string_view>& out) const {
  if (text.empty()) return {};
  if (compiled_->codes.empty()) {
    out.push_back(text);
    return {};
  }
  // Match data and a JIT stack big enough for long whitespace or letter runs.
  struct Scratch {
    pcre2_match_data* md = pcre2_match_data_create(4, nullptr);
    pcre2_match_context* mctx = pcre2_match_context_create(nullptr);
    pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    Scratch() { pcre2_jit_stack_assign(mctx, nullptr, stack); }
    ~Scratch() {
      pcre2_jit_stack_free(stack);
      pcre2_match_context_free(mctx);
      pcre2_match_data_free(md);
    }
  };
  thread_local Scratch scratch;
  std::vector<std::string_view> cur{text};
  std::vector<std::string_view> next;
  for (size_t k = 0; k < compiled_->codes.size(); ++k) {
    next.clear();
    KILN_TRY_STATUS(split_by(compiled_->codes[k], cur, next, scratch.md, scratch.mctx));
    cur.swap(next);
  }
  out.insert(out.end(), cur.begin(), cur.end());
  return {};
}

}  // namespace kiln::tokenizer
