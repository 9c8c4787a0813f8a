#include "kiln/tokenizer/tokenizer.h"

#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <mutex>
#include <unordered_map>

#include "kiln/tokenizer/bpe.h"
#include "kiln/tokenizer/byte_level.h"
#include "kiln/tokenizer/pretokenizer.h"
#include "kiln/tokenizer/wordpiece.h"
#include "kiln/util/log.h"
#include "kiln/util/utf8.h"

namespace kiln::tokenizer {

using detail::PairMerge;
using detail::PairTable;
using detail::Symbol;

namespace {

constexpr std::string_view kSpaceMark = "\xE2\x96\x81";  // U+2581 ▁, SentencePiece's space
constexpr size_t kMaxCachedWordBytes = 256;
constexpr size_t kMaxCacheEntries = 1 << 16;

// NFC (Unicode canonical composition). Text whose bytes are all below 0xCC is already NFC:
// every code point below U+0300 is its own NFC form and cannot compose with a neighbour.
std::string nfc(std::string_view s) {
  const bool maybe_changes =
      std::any_of(s.begin(), s.end(), [](char c) { return static_cast<uint8_t>(c) >= 0xCC; });
  if (!maybe_changes) return std::string(s);
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(
      reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()),
      &out, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) return std::string(s);  // only on invalid UTF-8, which encode rejects first
  std::string r(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
  std::free(out);
  return r;
}

// Hash for heterogeneous lookup: find(string_view) without building a std::string.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <typename V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

bool is_special_type(TokenType t) {
  return t == TokenType::kControl || t == TokenType::kUnknown;
}

// "<0x0A>" -> 0x0A; -1 when `text` is not a byte token's text.
int parse_byte_token(std::string_view text) {
  if (text.size() != 6 || !text.starts_with("<0x") || text[5] != '>') return -1;
  int v = 0;
  for (int i = 3; i < 5; ++i) {
    const char c = text[i];
    int d = -1;
    if (c >= '0' && c <= '9') d = c - '0';
    if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
    if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (true) {
    const size_t hit = s.find(from, pos);
    if (hit == std::string_view::npos) break;
    out.append(s.substr(pos, hit - pos)).append(to);
    pos = hit + from.size();
  }
  out.append(s.substr(pos));
  return out;
}

}  // namespace

struct Tokenizer::Impl {
  VocabData vocab;
  bool byte_level = false;
  bool wordpiece = false;  // "bert"
  wordpiece::NormalizerOptions bert_norm;
  bool add_bos = false;
  bool add_eos = false;
  bool add_space_prefix = false;
  bool nfc = false;
  bool ignore_merges = false;
  std::optional<PreTokenizer> pre;
  std::optional<int32_t> unk_id;

  std::vector<TokenType> types;
  StringMap<int32_t> text_to_id;
  // Byte-level: the raw bytes of each normal token -> id (for ignore_merges lookups).
  StringMap<int32_t> bytes_to_id;
  // The bytes each token contributes to decode's output.
  std::vector<std::string> pieces;
  // Byte-level: id of the one-character token of each byte. SentencePiece: id of <0xXX>.
  std::array<int32_t, 256> byte_token{};
  PairTable pairs;

  struct Special {
    std::string text;
    int32_t id;
    bool parse_always;  // user-defined tokens match even when parse_special is off
  };
  // Added tokens grouped by first byte, longest first (tokenizers' longest-match split).
  std::array<std::vector<Special>, 256> specials_by_byte;

  mutable std::mutex cache_mu;
  mutable StringMap<std::vector<int32_t>> cache;
  // SentencePiece: no token has "▁" after another character, so a word can be cut before
  // every "▁" that follows another character without changing the merges.
  bool spm_segmentable = false;

  Status init();
  Status configure_model();
  void index_byte_tokens();
  bool check_spm_segmentable() const;
  void index_specials();
  Status build_pairs();
  void build_pieces();

  struct Fragment {
    std::string_view text;
    int32_t token = -1;
  };
  // literal: ranges where no control token may match (see Tokenizer::encode).
  std::vector<Fragment> split_specials(std::string_view text, bool parse_special,
                                       std::span<const TextRange> literal = {},
                                       std::vector<TextRange>* control_hits = nullptr) const;
  Status encode_byte_level(std::string_view text, std::vector<int32_t>& out) const;
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
  void encode_spm_word(std::string_view word, std::vector<int32_t>& out) const;
  void merge_word(std::string_view word, std::vector<Symbol>& syms,
                  std::vector<int32_t>& out) const;
  bool cache_lookup(std::string_view word, std::vector<int32_t>& out) const;
  void cache_store(std::string_view word, std::vector<int32_t> ids) const;
  void encode_sentencepiece(std::string_view text, std::vector<int32_t>& out) const;
  void encode_wordpiece(std::string_view text, std::vector<int32_t>& out) const;
  void emit_unknown_bytes(std::string_view bytes, std::vector<int32_t>& out) const;
};

Status Tokenizer::Impl::init() {
  const size_t n = vocab.tokens.size();
  if (n == 0) return err("vocabulary has no tokens (tokenizer.ggml.tokens is empty)");
  if (n > static_cast<size_t>(INT32_MAX)) return err("vocabulary has {} tokens; too many", n);
  if (!vocab.token_type.empty() && vocab.token_type.size() != n) {
    return err("tokenizer.ggml.token_type has {} entries for {} tokens", vocab.token_type.size(),
               n);
  }
  if (!vocab.scores.empty() && vocab.scores.size() != n) {
    return err("tokenizer.ggml.scores has {} entries for {} tokens", vocab.scores.size(), n);
  }
  const std::pair<const char*, const std::optional<int32_t>*> ids[] = {
      {"bos", &vocab.bos_id},       {"eos", &vocab.eos_id},     {"eot", &vocab.eot_id},
      {"eom", &vocab.eom_id},       {"unknown", &vocab.unk_id}, {"padding", &vocab.pad_id},
      {"seperator", &vocab.sep_id}, {"cls", &vocab.cls_id},     {"mask", &vocab.mask_id}};
  for (const auto& [name, id] : ids) {
    if (id->has_value() && (**id < 0 || static_cast<size_t>(**id) >= n)) {
      return err("tokenizer.ggml.{}_token_id = {} is outside the vocabulary of {} tokens", name,
                 **id, n);
    }
  }
  types.resize(n, TokenType::kNormal);
  for (size_t i = 0; i < vocab.token_type.size(); ++i) {
    const int32_t t = vocab.token_type[i];
    if (t < 0 || t > 6) return err("token {} has unknown token_type {}", i, t);
    types[i] = t == 0 ? TokenType::kNormal : static_cast<TokenType>(t);
  }
  text_to_id.reserve(n);
  for (size_t i = 0; i < n; ++i) text_to_id.emplace(vocab.tokens[i], static_cast<int32_t>(i));
  KILN_TRY_STATUS(configure_model());
  index_byte_tokens();
  build_pieces();
  KILN_TRY_STATUS(build_pairs());
  if (!byte_level && !wordpiece) spm_segmentable = check_spm_segmentable();
  index_specials();
  return {};
}

Status Tokenizer::Impl::configure_model() {
  if (vocab.model == "gpt2") {
    byte_level = true;
    const PreTokenizerSpec* spec = find_pre_tokenizer(vocab.pre.empty() ? "default" : vocab.pre);
    if (spec == nullptr) {
      return err("unknown pre-tokenizer '{}' (tokenizer.ggml.pre); kiln knows {}", vocab.pre, [] {
        std::string names;
        for (const auto& s : known_pre_tokenizers()) {
          names += names.empty() ? "" : ", ";
          names += s.names.front();
        }
        return names;
      }());
    }
    KILN_TRY(PreTokenizer p, PreTokenizer::create(*spec));
    pre = std::move(p);
    nfc = spec->nfc;
    ignore_merges = spec->ignore_merges;
    add_bos = vocab.add_bos_token.value_or(spec->default_add_bos);
    add_space_prefix = vocab.add_space_prefix.value_or(false);
    if (vocab.merges.empty()) return err("byte-level BPE vocabulary has no tokenizer.ggml.merges");
  } else if (vocab.model == "llama") {
    add_bos = vocab.add_bos_token.value_or(true);
    add_space_prefix = vocab.add_space_prefix.value_or(true);
  } else if (vocab.model == "bert") {
    // [CLS] text [SEP]: gguf-py writes cls as bos and sep as eos when the tokenizer names
    // no bos/eos; files that only carry cls/sep ids get the same here.
    wordpiece = true;
    if (!vocab.bos_id) vocab.bos_id = vocab.cls_id;
    if (!vocab.eos_id) vocab.eos_id = vocab.sep_id;
    add_bos = vocab.add_bos_token.value_or(true);
    bert_norm.lowercase = vocab.bert_lowercase.value_or(true);
    bert_norm.strip_accents = vocab.bert_strip_accents.value_or(bert_norm.lowercase);
  } else {
    return err(
        "unsupported tokenizer model '{}' (tokenizer.ggml.model); kiln supports gpt2, llama "
        "and bert",
        vocab.model);
  }
  add_eos = vocab.add_eos_token.value_or(wordpiece);
  if (add_bos && !vocab.bos_id) return err("add_bos_token is set but there is no bos_token_id");
  if (add_eos && !vocab.eos_id) return err("add_eos_token is set but there is no eos_token_id");
  unk_id = vocab.unk_id;
  if (!unk_id) {
    auto it = text_to_id.find("<unk>");
    if (it != text_to_id.end() && types[it->second] == TokenType::kUnknown) unk_id = it->second;
  }
  if (!unk_id && wordpiece) {
    auto it = text_to_id.find("[UNK]");
    if (it != text_to_id.end()) unk_id = it->second;
  }
  return {};
}

void Tokenizer::Impl::index_byte_tokens() {
  byte_token.fill(-1);
  for (int b = 0; b < 256; ++b) {
    std::string key;
    if (byte_level) {
      utf8::append(key, byte_to_unicode(static_cast<uint8_t>(b)));
    } else {
      key = fmt::format("<0x{:02X}>", b);
    }
    auto it = text_to_id.find(key);
    if (it != text_to_id.end()) byte_token[b] = it->second;
  }
}

bool Tokenizer::Impl::check_spm_segmentable() const {
  for (size_t i = 0; i < vocab.tokens.size(); ++i) {
    if (types[i] != TokenType::kNormal && types[i] != TokenType::kUserDefined) continue;
    std::string_view t = vocab.tokens[i];
    while (t.starts_with(kSpaceMark)) t.remove_prefix(kSpaceMark.size());
    if (t.find(kSpaceMark) != std::string_view::npos) return false;
  }
  return true;
}

void Tokenizer::Impl::index_specials() {
  for (size_t i = 0; i < vocab.tokens.size(); ++i) {
    const TokenType t = types[i];
    if (t != TokenType::kControl && t != TokenType::kUserDefined && t != TokenType::kUnknown) {
      continue;
    }
    const std::string& text = vocab.tokens[i];
    if (text.empty()) continue;
    specials_by_byte[static_cast<uint8_t>(text[0])].push_back(
        {text, static_cast<int32_t>(i), t == TokenType::kUserDefined});
  }
  for (auto& bucket : specials_by_byte) {
    std::stable_sort(bucket.begin(), bucket.end(), [](const Special& a, const Special& b) {
      return a.text.size() > b.text.size();
    });
  }
}

void Tokenizer::Impl::build_pieces() {
  const size_t n = vocab.tokens.size();
  pieces.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const std::string& text = vocab.tokens[i];
    if (wordpiece) {
      pieces[i] = types[i] == TokenType::kUnused
                      ? std::string()
                      : wordpiece::decode_piece(text, types[i] != TokenType::kNormal &&
                                                          types[i] != TokenType::kUndefined);
      continue;
    }
    switch (types[i]) {
      case TokenType::kUnused:
        break;
      case TokenType::kByte: {
        const int b = parse_byte_token(text);
        pieces[i] = b >= 0 ? std::string(1, static_cast<char>(b)) : text;
        break;
      }
      case TokenType::kNormal:
      case TokenType::kUndefined:
        if (byte_level) {
          std::optional<std::string> bytes = byte_level_decode(text);
          if (bytes) {
            pieces[i] = *bytes;
            bytes_to_id.emplace(*bytes, static_cast<int32_t>(i));
          } else {
            pieces[i] = text;
          }
        } else {
          pieces[i] = replace_all(text, kSpaceMark, " ");
        }
        break;
      default:  // control, unknown, user-defined: their literal text
        pieces[i] = byte_level ? text : replace_all(text, kSpaceMark, " ");
        break;
    }
  }
}

Status Tokenizer::Impl::build_pairs() {
  if (wordpiece) return {};  // greedy longest match: no merges
  if (!vocab.merges.empty()) {
    if (vocab.merges.size() > (1u << 24)) {
      return err("{} merges: more than kiln's 2^24 (ranks are stored as floats)",
                 vocab.merges.size());
    }
    pairs.reserve(vocab.merges.size());
    size_t num_skipped = 0;
    for (size_t rank = 0; rank < vocab.merges.size(); ++rank) {
      const std::string& m = vocab.merges[rank];
      const size_t sp = m.find(' ', 1);
      if (sp == std::string::npos) return err("merge {} ('{}') has no space", rank, m);
      const std::string left = m.substr(0, sp);
      const std::string right = m.substr(sp + 1);
      auto l = text_to_id.find(left);
      auto r = text_to_id.find(right);
      auto merged = text_to_id.find(left + right);
      if (l == text_to_id.end() || r == text_to_id.end() || merged == text_to_id.end()) {
        ++num_skipped;
        continue;
      }
      pairs.add(l->second, r->second, {static_cast<float>(rank), merged->second});
    }
    if (num_skipped > 0)
      log::warn("tokenizer: {} merges name tokens not in the vocabulary", num_skipped);
    return {};
  }
  // SentencePiece without merges (llama.cpp GGUFs): any two tokens whose concatenation is
  // a token merge into it, best score first (llama.cpp llm_tokenizer_spm).
  if (vocab.scores.empty()) return err("SentencePiece vocabulary has neither merges nor scores");
  for (size_t i = 0; i < vocab.tokens.size(); ++i) {
    if (types[i] != TokenType::kNormal && types[i] != TokenType::kUserDefined) continue;
    const std::string& t = vocab.tokens[i];
    for (size_t k = 1; k < t.size(); ++k) {
      if ((static_cast<uint8_t>(t[k]) & 0xC0) == 0x80) continue;  // split on characters
      auto l = text_to_id.find(std::string_view(t).substr(0, k));
      if (l == text_to_id.end()) continue;
      auto r = text_to_id.find(std::string_view(t).substr(k));
      if (r == text_to_id.end()) continue;
      pairs.add(l->second, r->second, {-vocab.scores[i], static_cast<int32_t>(i)});
    }
  }
  return {};
}

std::vector<Tokenizer::Impl::Fragment> Tokenizer::Impl::split_specials(
    std::string_view text, bool parse_special, std::span<const TextRange> literal,
    std::vector<TextRange>* control_hits) const {
  std::vector<Fragment> out;
  size_t start = 0;
  size_t i = 0;
  size_t next_literal = 0;  // the first literal range that ends after i
  while (i < text.size()) {
    const auto& bucket = specials_by_byte[static_cast<uint8_t>(text[i])];
    const Special* hit = nullptr;
    while (next_literal < literal.size() && literal[next_literal].end <= i) ++next_literal;
    for (const Special& s : bucket) {
      if (!(parse_special || s.parse_always) || !text.substr(i).starts_with(s.text)) continue;
      // A control token whose text overlaps a literal range stays text.
      if (!s.parse_always && next_literal < literal.size() &&
          literal[next_literal].begin < i + s.text.size())
        continue;
      hit = &s;
      break;
    }
    if (hit == nullptr) {
      ++i;
      continue;
    }
    if (control_hits != nullptr && !hit->parse_always)
      control_hits->push_back({i, i + hit->text.size()});
    if (i > start) out.push_back({text.substr(start, i - start), -1});
    out.push_back({{}, hit->id});
    i += hit->text.size();
    start = i;
  }
  if (start < text.size()) out.push_back({text.substr(start), -1});
  return out;
}

void Tokenizer::Impl::emit_unknown_bytes(std::string_view bytes, std::vector<int32_t>& out) const {
  // Byte fallback when every byte has its token, else the unknown token (or nothing, as
  // tokenizers does when the model has no unk_token).
  const bool all = std::all_of(bytes.begin(), bytes.end(),
                               [&](char c) { return byte_token[static_cast<uint8_t>(c)] >= 0; });
  if (all && !byte_level) {
    for (char c : bytes) out.push_back(byte_token[static_cast<uint8_t>(c)]);
  } else if (unk_id) {
    out.push_back(*unk_id);
  }
}

bool Tokenizer::Impl::cache_lookup(std::string_view word, std::vector<int32_t>& out) const {
  if (word.size() > kMaxCachedWordBytes) return false;
  std::lock_guard<std::mutex> lock(cache_mu);
  auto it = cache.find(word);
  if (it == cache.end()) return false;
  out.insert(out.end(), it->second.begin(), it->second.end());
  return true;
}

void Tokenizer::Impl::cache_store(std::string_view word, std::vector<int32_t> ids) const {
  if (word.size() > kMaxCachedWordBytes) return;
  std::lock_guard<std::mutex> lock(cache_mu);
  if (cache.size() >= kMaxCacheEntries) cache.clear();
  cache.emplace(std::string(word), std::move(ids));
}

void Tokenizer::Impl::merge_word(std::string_view word, std::vector<Symbol>& syms,
                                 std::vector<int32_t>& out) const {
  std::vector<int32_t> ids;
  if (!syms.empty()) {
    detail::merge_symbols(pairs, syms);
    for (int32_t k = 0; k >= 0; k = syms[k].next) {
      if (syms[k].id >= 0) {
        ids.push_back(syms[k].id);
      } else {
        emit_unknown_bytes(word.substr(syms[k].start, syms[k].len), ids);
      }
    }
  }
  out.insert(out.end(), ids.begin(), ids.end());
  cache_store(word, std::move(ids));
}

void Tokenizer::Impl::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (ignore_merges) {
    auto it = bytes_to_id.find(word);
    if (it != bytes_to_id.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (cache_lookup(word, out)) return;
  // One symbol per byte, as its GPT-2 alphabet character's token.
  std::vector<Symbol> syms(word.size());
  for (size_t k = 0; k < word.size(); ++k) {
    syms[k].id = byte_token[static_cast<uint8_t>(word[k])];
    syms[k].start = static_cast<uint32_t>(k);
    syms[k].len = 1;
  }
  merge_word(word, syms, out);
}

void Tokenizer::Impl::encode_spm_word(std::string_view word, std::vector<int32_t>& out) const {
  if (cache_lookup(word, out)) return;
  // One symbol per UTF-8 character (the text is valid UTF-8).
  std::vector<Symbol> syms;
  syms.reserve(word.size());
  size_t pos = 0;
  while (pos < word.size()) {
    const auto len =
        static_cast<size_t>(std::max(1, utf8::sequence_length(static_cast<uint8_t>(word[pos]))));
    auto it = text_to_id.find(word.substr(pos, len));
    Symbol sym;
    sym.id = it == text_to_id.end() ? -1 : it->second;
    sym.start = static_cast<uint32_t>(pos);
    sym.len = static_cast<uint32_t>(len);
    syms.push_back(sym);
    pos += len;
  }
  merge_word(word, syms, out);
}

Status Tokenizer::Impl::encode_byte_level(std::string_view text, std::vector<int32_t>& out) const {
  std::string normalized;
  if (nfc) {
    normalized = kiln::tokenizer::nfc(text);
    text = normalized;
  }
  std::vector<std::string_view> words;
  KILN_TRY_STATUS(pre->split(text, words));
  for (std::string_view w : words) encode_word(w, out);
  return {};
}

void Tokenizer::Impl::encode_sentencepiece(std::string_view text, std::vector<int32_t>& out) const {
  std::string s;
  s.reserve(text.size() + 3);
  if (add_space_prefix) s.append(kSpaceMark);
  s.append(replace_all(text, " ", kSpaceMark));
  const std::string_view all(s);
  if (!spm_segmentable) {
    encode_spm_word(all, out);
    return;
  }
  size_t start = 0;
  for (size_t pos = all.find(kSpaceMark, 1); pos != std::string_view::npos;
       pos = all.find(kSpaceMark, pos + kSpaceMark.size())) {
    if (all.substr(0, pos).ends_with(kSpaceMark)) continue;  // inside a run of "▁"
    encode_spm_word(all.substr(start, pos - start), out);
    start = pos;
  }
  encode_spm_word(all.substr(start), out);
}

void Tokenizer::Impl::encode_wordpiece(std::string_view text, std::vector<int32_t>& out) const {
  const std::string normalized = wordpiece::normalize(text, bert_norm);
  std::vector<std::string_view> words;
  wordpiece::pre_tokenize(normalized, words);
  // Word pieces are the vocabulary's normal tokens ("▁word" or a continuation).
  const auto lookup = [this](std::string_view piece) -> std::optional<int32_t> {
    auto it = text_to_id.find(piece);
    if (it == text_to_id.end() || types[it->second] != TokenType::kNormal) return std::nullopt;
    return it->second;
  };
  for (std::string_view w : words) {
    if (cache_lookup(w, out)) continue;
    std::vector<int32_t> ids;
    wordpiece::encode_word(w, lookup, unk_id, ids);
    out.insert(out.end(), ids.begin(), ids.end());
    cache_store(w, std::move(ids));
  }
}

Expected<Tokenizer> Tokenizer::create(VocabData vocab) {
  auto impl = std::make_shared<Impl>();
  impl->vocab = std::move(vocab);
  KILN_TRY_STATUS(impl->init());
  Tokenizer t;
  t.impl_ = std::move(impl);
  return t;
}

Expected<std::vector<int32_t>> Tokenizer::encode(std::string_view text, bool add_special,
                                                 bool parse_special) const {
  return encode(text, add_special, parse_special, {});
}

std::vector<TextRange> Tokenizer::find_control_texts(std::string_view text) const {
  std::vector<TextRange> hits;
  impl_->split_specials(text, /*parse_special=*/true, {}, &hits);
  return hits;
}

Expected<std::vector<int32_t>> Tokenizer::encode(std::string_view text, bool add_special,
                                                 bool parse_special,
                                                 std::span<const TextRange> literal) const {
  const Impl& m = *impl_;
  const size_t bad = utf8::find_invalid(text);
  if (bad != utf8::kNpos) {
    return err("text is not valid UTF-8: invalid byte 0x{:02X} at offset {}",
               static_cast<uint8_t>(text[bad]), bad);
  }
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (add_special && m.add_bos) out.push_back(*m.vocab.bos_id);
  for (const Impl::Fragment& f : m.split_specials(text, parse_special, literal)) {
    if (f.token >= 0) {
      out.push_back(f.token);
    } else if (m.byte_level) {
      KILN_TRY_STATUS(m.encode_byte_level(f.text, out));
    } else if (m.wordpiece) {
      m.encode_wordpiece(f.text, out);
    } else {
      m.encode_sentencepiece(f.text, out);
    }
  }
  if (add_special && m.add_eos) out.push_back(*m.vocab.eos_id);
  return out;
}

std::string_view Tokenizer::token_piece(int32_t id, bool skip_special) const {
  const Impl& m = *impl_;
  if (id < 0 || static_cast<size_t>(id) >= m.pieces.size()) return {};
  if (skip_special && is_special_type(m.types[id])) return {};
  return m.pieces[id];
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string raw;
  for (int32_t id : ids) raw.append(token_piece(id, skip_special));
  std::string out = utf8::repair(raw);
  if (strips_leading_space() && !out.empty() && out[0] == ' ') out.erase(0, 1);
  return out;
}

std::string_view Tokenizer::token_text(int32_t id) const {
  if (id < 0 || id >= num_tokens()) return {};
  return impl_->vocab.tokens[id];
}
TokenType Tokenizer::token_type(int32_t id) const {
  if (id < 0 || id >= num_tokens()) return TokenType::kUndefined;
  return impl_->types[id];
}
std::optional<int32_t> Tokenizer::find_token(std::string_view text) const {
  auto it = impl_->text_to_id.find(text);
  if (it == impl_->text_to_id.end()) return std::nullopt;
  return it->second;
}
int32_t Tokenizer::num_tokens() const {
  return static_cast<int32_t>(impl_->vocab.tokens.size());
}
bool Tokenizer::strips_leading_space() const {
  // WordPiece: every word's piece starts with " " and the decoder drops the first.
  return impl_->wordpiece || (!impl_->byte_level && impl_->add_space_prefix);
}
bool Tokenizer::add_bos() const {
  return impl_->add_bos;
}
bool Tokenizer::add_eos() const {
  return impl_->add_eos;
}
std::optional<int32_t> Tokenizer::bos_id() const {
  return impl_->vocab.bos_id;
}
std::optional<int32_t> Tokenizer::eos_id() const {
  return impl_->vocab.eos_id;
}
const VocabData& Tokenizer::vocab() const {
  return impl_->vocab;
}

}  // namespace kiln::tokenizer
