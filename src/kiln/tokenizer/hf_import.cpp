#include "kiln/tokenizer/hf_import.h"

#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "kiln/tokenizer/pretokenizer.h"
#include "kiln/tokenizer/wordpiece.h"

namespace kiln::tokenizer {
namespace {

using nlohmann::json;

constexpr size_t kMaxVocab = 16u << 20;  // far above any real vocabulary
constexpr std::string_view kSpaceMark = "\xE2\x96\x81";

Expected<std::string> read_file(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return err("cannot open {}", path.string());
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) return err("cannot read {}", path.string());
  return ss.str();
}

// tokenizer_config.json spells special tokens as "text" or {"content": "text", ...}.
std::optional<std::string> token_content(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    return v["content"].get<std::string>();
  }
  return std::nullopt;
}

// convert_hf_to_gguf.py does_token_look_special: added tokens some models forget to mark.
bool looks_special(std::string_view t) {
  if (t == "<pad>" || t == "<mask>" || t == "<2mass>" || t == "[@BOS@]") return true;
  if (t.starts_with("<|") && t.ends_with("|>")) return true;
  if (t.starts_with("<\xEF\xBD\x9C") && t.ends_with("\xEF\xBD\x9C>")) return true;  // <｜ ｜>
  return t.starts_with("<unused") && t.ends_with(">");
}

std::string replace_all(std::string s, std::string_view from, std::string_view to) {
  size_t pos = 0;
  while ((pos = s.find(from, pos)) != std::string::npos) {
    s.replace(pos, from.size(), to);
    pos += to.size();
  }
  return s;
}

// obj[key], or null when obj is not an object or lacks the key (const operator[] on a
// missing key is undefined behaviour in nlohmann::json).
const json& field(const json& obj, const char* key) {
  static const json null_value;
  if (!obj.is_object()) return null_value;
  auto it = obj.find(key);
  return it == obj.end() ? null_value : *it;
}

bool is_byte_token_text(std::string_view t) {
  auto hex = [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'F') || (c >= 'a' && c <= 'f');
  };
  return t.size() == 6 && t.starts_with("<0x") && t[5] == '>' && hex(t[3]) && hex(t[4]);
}

// The tokenizer.json pre_tokenizer as kiln's signature steps (see PreTokenizerSpec).
Status pre_tokenizer_signature(const json& pt, std::vector<std::string>& out) {
  if (pt.is_null()) return {};
  const std::string type = pt.value("type", "");
  if (type == "Sequence") {
    for (const json& p : pt.at("pretokenizers")) KILN_TRY_STATUS(pre_tokenizer_signature(p, out));
    return {};
  }
  if (type == "Split") {
    const json& pattern = pt.at("pattern");
    if (!pattern.contains("Regex")) return err("pre_tokenizer Split with a String pattern");
    const std::string behavior = pt.value("behavior", "");
    if (behavior != "Isolated" || pt.value("invert", false)) {
      return err("pre_tokenizer Split with behavior '{}' invert {} is not supported", behavior,
                 pt.value("invert", false));
    }
    out.push_back("Split:" + pattern["Regex"].get<std::string>());
    return {};
  }
  if (type == "Digits") {
    out.push_back(pt.value("individual_digits", false) ? "Digits:individual" : "Digits");
    return {};
  }
  if (type == "ByteLevel") {
    if (pt.value("add_prefix_space", false)) {
      return err("pre_tokenizer ByteLevel with add_prefix_space is not supported");
    }
    out.push_back(pt.value("use_regex", true) ? "ByteLevel:regex" : "ByteLevel");
    return {};
  }
  return err("pre_tokenizer step '{}' is not supported", type);
}

bool has_normalizer(const json& n, std::string_view type) {
  if (n.is_null()) return false;
  if (n.value("type", "") == type) return true;
  if (n.value("type", "") == "Sequence") {
    for (const json& c : n.at("normalizers")) {
      if (has_normalizer(c, type)) return true;
    }
  }
  return false;
}

Expected<std::string> recognise_pre_tokenizer(const json& tok) {
  std::vector<std::string> sig;
  KILN_TRY_STATUS(pre_tokenizer_signature(field(tok, "pre_tokenizer"), sig));
  const bool ignore_merges = field(tok, "model").value("ignore_merges", false);
  const bool nfc = has_normalizer(field(tok, "normalizer"), "NFC");
  for (const PreTokenizerSpec& spec : known_pre_tokenizers()) {
    if (spec.names.front() == "default") continue;  // llama.cpp's fallback, no HF source
    if (spec.signature.size() != sig.size()) continue;
    if (!std::equal(sig.begin(), sig.end(), spec.signature.begin())) continue;
    if (spec.ignore_merges != ignore_merges || spec.nfc != nfc) {
      return err(
          "pre-tokenizer matches '{}' but tokenizer.json has ignore_merges={} NFC={} where "
          "kiln's '{}' has ignore_merges={} NFC={}",
          spec.names.front(), ignore_merges, nfc, spec.names.front(), spec.ignore_merges, spec.nfc);
    }
    return std::string(spec.names.front());
  }
  std::string shown;
  for (const std::string& s : sig) shown += (shown.empty() ? "" : " + ") + s;
  return err(
      "unknown pre-tokenizer in tokenizer.json: [{}]; kiln recognises the pipelines of "
      "llama-bpe, qwen2, gpt-2, smollm, tekken, gpt-4o, deepseek-v3, deepseek-llm",
      shown);
}

// SentencePiece-style settings from the normalizer / Metaspace pre-tokenizer.
Expected<bool> sentencepiece_space_prefix(const json& tok) {
  const json& pt = field(tok, "pre_tokenizer");
  if (!pt.is_null()) {
    if (pt.value("type", "") != "Metaspace") {
      return err("SentencePiece-style tokenizer.json with pre_tokenizer '{}' is not supported",
                 pt.value("type", ""));
    }
    // "first" prefixes only the first fragment in HF; kiln, like llama.cpp, prefixes each
    // fragment after an added token (see docs/tokenizer.md).
    return pt.value("prepend_scheme", "always") != "never" && pt.value("add_prefix_space", true);
  }
  const json& n = field(tok, "normalizer");
  bool prepend = false;
  bool replace = false;
  std::vector<json> steps;
  if (n.value("type", "") == "Sequence") {
    for (const json& c : n.at("normalizers")) steps.push_back(c);
  } else if (!n.is_null()) {
    steps.push_back(n);
  }
  for (const json& s : steps) {
    const std::string type = s.value("type", "");
    if (type == "Prepend" && s.value("prepend", "") == kSpaceMark) {
      prepend = true;
    } else if (type == "Replace" && field(s, "pattern").value("String", "") == " " &&
               s.value("content", "") == kSpaceMark) {
      replace = true;
    } else {
      return err("SentencePiece-style normalizer step '{}' is not supported", type);
    }
  }
  if (!replace) return err("SentencePiece-style tokenizer.json without the ' ' -> '▁' normalizer");
  return prepend;
}

struct AddedToken {
  int64_t id;
  std::string content;
  bool special;
};

// add_bos/add_eos from the post_processor (the template HF's encode applies).
void template_specials(const json& pp, std::optional<std::string>& first,
                       std::optional<std::string>& last) {
  if (pp.is_null()) return;
  const std::string type = pp.value("type", "");
  if (type == "Sequence") {
    for (const json& p : pp.at("processors")) template_specials(p, first, last);
    return;
  }
  if (type == "BertProcessing" || type == "RobertaProcessing") {  // cls A sep
    if (pp.contains("cls") && pp["cls"].is_array() && !pp["cls"].empty())
      first = pp["cls"].front().get<std::string>();
    if (pp.contains("sep") && pp["sep"].is_array() && !pp["sep"].empty())
      last = pp["sep"].front().get<std::string>();
    return;
  }
  if (type != "TemplateProcessing") return;
  const json& single = pp.at("single");
  if (single.empty()) return;
  if (single.front().contains("SpecialToken")) {
    first = single.front()["SpecialToken"].at("id").get<std::string>();
  }
  if (single.size() > 1 && single.back().contains("SpecialToken")) {
    last = single.back()["SpecialToken"].at("id").get<std::string>();
  }
}

// WordPiece (BERT): BertNormalizer + BertPreTokenizer + WordPiece with "##" continuations.
Status convert_wordpiece_kind(const json& tok, VocabData& v) {
  const json& model = tok.at("model");
  v.model = "bert";
  v.pre = "default";
  if (model.value("continuing_subword_prefix", "##") != "##")
    return err("WordPiece continuing_subword_prefix '{}' is not supported (kiln: ##)",
               model.value("continuing_subword_prefix", ""));
  if (model.value("max_input_chars_per_word", wordpiece::kMaxInputCharsPerWord) !=
      wordpiece::kMaxInputCharsPerWord)
    return err("WordPiece max_input_chars_per_word {} is not supported (kiln: {})",
               model.value("max_input_chars_per_word", 0), wordpiece::kMaxInputCharsPerWord);
  const json& n = field(tok, "normalizer");
  if (n.value("type", "") != "BertNormalizer")
    return err(
        "WordPiece tokenizer.json with normalizer '{}' is not supported (kiln: "
        "BertNormalizer)",
        n.value("type", ""));
  if (!n.value("clean_text", true) || !n.value("handle_chinese_chars", true))
    return err("BertNormalizer without clean_text or handle_chinese_chars is not supported");
  const bool lowercase = n.value("lowercase", true);
  // Keys only where the model differs from uncased BERT (what llama.cpp assumes).
  if (!lowercase) v.bert_lowercase = false;
  const json& strip = field(n, "strip_accents");
  if (strip.is_boolean() && strip.get<bool>() != lowercase)
    v.bert_strip_accents = strip.get<bool>();
  const std::string pre = field(tok, "pre_tokenizer").value("type", "");
  if (pre != "BertPreTokenizer")
    return err(
        "WordPiece tokenizer.json with pre_tokenizer '{}' is not supported (kiln: "
        "BertPreTokenizer)",
        pre);
  return {};
}

// llama.cpp's phantom-space vocabulary: "##ing" -> "ing", "the" -> "▁the"; special tokens
// keep their text (kiln also keeps user-defined added tokens literal, so text matches them).
void to_phantom_space(VocabData& v) {
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    const auto type = static_cast<TokenType>(v.token_type[i]);
    if (type != TokenType::kNormal) continue;
    std::string& t = v.tokens[i];
    if (t.starts_with("##")) {
      t.erase(0, 2);
    } else {
      t.insert(0, kSpaceMark);
    }
  }
}

// model, pre and add_space_prefix; returns whether the vocabulary is byte-level.
Expected<bool> convert_kind(const json& tok, VocabData& v) {
  const json& model = tok.at("model");
  if (model.value("type", "BPE") == "WordPiece") {
    KILN_TRY_STATUS(convert_wordpiece_kind(tok, v));
    return false;
  }
  if (model.value("type", "BPE") != "BPE") {
    return err("tokenizer.json model type '{}' is not supported (kiln supports BPE, WordPiece)",
               model.value("type", ""));
  }
  const bool byte_level =
      (field(tok, "pre_tokenizer").dump().find("\"ByteLevel\"") != std::string::npos ||
       field(tok, "decoder").dump().find("\"ByteLevel\"") != std::string::npos) &&
      !model.value("byte_fallback", false);
  v.model = byte_level ? "gpt2" : "llama";
  if (byte_level) {
    KILN_TRY(v.pre, recognise_pre_tokenizer(tok));
    if (!model.value("continuing_subword_prefix", json()).is_null() &&
        model["continuing_subword_prefix"] != "") {
      return err("BPE continuing_subword_prefix is not supported");
    }
    if (!model.value("end_of_word_suffix", json()).is_null() && model["end_of_word_suffix"] != "") {
      return err("BPE end_of_word_suffix is not supported");
    }
  } else {
    v.pre = "default";
    KILN_TRY(bool prefix, sentencepiece_space_prefix(tok));
    v.add_space_prefix = prefix;
  }
  if (!model.value("dropout", json()).is_null()) return err("BPE dropout is not supported");
  return byte_level;
}

// Token text and type by id: the model vocabulary, then added tokens (which may extend
// it), padded to vocab_size with unused "[PAD<id>]" tokens as the converter does.
Status convert_tokens(const json& tok, bool byte_level, std::optional<size_t> vocab_size,
                      VocabData& v, std::vector<AddedToken>& added) {
  const json& model = tok.at("model");
  std::map<int64_t, std::string> by_id;
  for (const auto& [text, id] : model.at("vocab").items()) by_id[id.get<int64_t>()] = text;
  for (const json& a : tok.value("added_tokens", json::array())) {
    added.push_back(
        {a.at("id").get<int64_t>(), a.at("content").get<std::string>(), a.value("special", false)});
    by_id[added.back().id] = added.back().content;
  }
  if (by_id.empty()) return err("tokenizer.json has an empty vocabulary");
  if (by_id.begin()->first < 0) return err("tokenizer.json has a negative token id");
  size_t n = static_cast<size_t>(by_id.rbegin()->first) + 1;
  if (vocab_size && *vocab_size > n) n = *vocab_size;
  if (n > kMaxVocab) return err("tokenizer.json token id {} is implausibly large", n - 1);

  std::unordered_map<int64_t, const AddedToken*> added_by_id;
  for (const AddedToken& a : added) added_by_id[a.id] = &a;
  const std::optional<std::string> unk_text =
      model.contains("unk_token") ? token_content(model["unk_token"]) : std::nullopt;
  v.tokens.resize(n);
  v.token_type.resize(n);
  for (size_t i = 0; i < n; ++i) {
    auto it = by_id.find(static_cast<int64_t>(i));
    if (it == by_id.end()) {
      v.tokens[i] = "[PAD" + std::to_string(i) + "]";
      v.token_type[i] = static_cast<int32_t>(TokenType::kUnused);
      continue;
    }
    std::string text = it->second;
    TokenType type = TokenType::kNormal;
    auto a = added_by_id.find(static_cast<int64_t>(i));
    if (!byte_level && v.model != "bert" && is_byte_token_text(text)) {
      type = TokenType::kByte;
    } else if (!byte_level && unk_text && text == *unk_text) {
      type = TokenType::kUnknown;
    } else if (a != added_by_id.end()) {
      if (a->second->special || looks_special(text)) {
        type = TokenType::kControl;
      } else {
        type = TokenType::kUserDefined;
        if (byte_level) text = replace_all(text, kSpaceMark, " ");
      }
    }
    v.tokens[i] = std::move(text);
    v.token_type[i] = static_cast<int32_t>(type);
  }
  return {};
}

Status convert_merges(const json& model, VocabData& v) {
  // Merges: "a b" strings, or [a, b] pairs (transformers >= 4.45), whose spaces llama.cpp
  // writes as U+0120 so the "a b" form stays unambiguous.
  for (const json& m : model.value("merges", json::array())) {
    if (m.is_string()) {
      v.merges.push_back(m.get<std::string>());
    } else if (m.is_array() && m.size() == 2) {
      v.merges.push_back(replace_all(m[0].get<std::string>(), " ", "\xC4\xA0") + " " +
                         replace_all(m[1].get<std::string>(), " ", "\xC4\xA0"));
    } else {
      return err("tokenizer.json merge entry {} has an unknown form", m.dump());
    }
  }
  return {};
}

// SentencePiece scores that reproduce the merge order for llama.cpp's score-based merging:
// -(1 + rank of the first merge producing the token), 0 for the rest.
void derive_scores(VocabData& v) {
  const size_t n = v.tokens.size();
  std::unordered_map<std::string, int32_t> text_to_id;
  for (size_t i = 0; i < n; ++i) text_to_id.emplace(v.tokens[i], static_cast<int32_t>(i));
  v.scores.assign(n, 0.0f);
  std::vector<bool> seen(n, false);
  for (size_t r = 0; r < v.merges.size(); ++r) {
    const std::string& m = v.merges[r];
    const size_t sp = m.find(' ', 1);
    if (sp == std::string::npos) continue;
    auto it = text_to_id.find(m.substr(0, sp) + m.substr(sp + 1));
    if (it == text_to_id.end() || seen[it->second]) continue;
    seen[it->second] = true;
    v.scores[it->second] = -static_cast<float>(r) - 1.0f;
  }
}

void convert_specials(const json& tok, const json& cfg, const std::vector<AddedToken>& added,
                      VocabData& v) {
  const json& model = tok.at("model");
  const std::optional<std::string> unk_text =
      model.contains("unk_token") ? token_content(model["unk_token"]) : std::nullopt;
  // Special ids: tokenizer_config names them; the ids are those of the added tokens.
  auto find_added = [&](const std::string& content) -> std::optional<int32_t> {
    for (const AddedToken& a : added) {
      if (a.content == content) return static_cast<int32_t>(a.id);
    }
    return std::nullopt;
  };
  auto special = [&](const char* key) -> std::optional<int32_t> {
    if (!cfg.contains(key)) return std::nullopt;
    auto c = token_content(cfg[key]);
    return c ? find_added(*c) : std::nullopt;
  };
  v.bos_id = special("bos_token");
  v.eos_id = special("eos_token");
  v.unk_id = special("unk_token");
  v.pad_id = special("pad_token");
  v.sep_id = special("sep_token");
  v.cls_id = special("cls_token");
  v.mask_id = special("mask_token");
  if (!v.unk_id && unk_text) v.unk_id = find_added(*unk_text);

  std::optional<std::string> first, last;
  template_specials(field(tok, "post_processor"), first, last);
  if (first && !v.bos_id) v.bos_id = find_added(*first);
  if (last && !v.eos_id) v.eos_id = find_added(*last);
  if (v.model == "bert") {
    // gguf-py: cls/sep name the template's ends when the config does not.
    if (first && !v.cls_id) v.cls_id = find_added(*first);
    if (last && !v.sep_id) v.sep_id = find_added(*last);
  }
  v.add_bos_token = first.has_value() && v.bos_id && find_added(*first) == v.bos_id;
  v.add_eos_token = last.has_value() && v.eos_id && find_added(*last) == v.eos_id;
  if (cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean()) {
    v.add_bos_token = cfg["add_bos_token"].get<bool>();
  }
  if (cfg.contains("add_eos_token") && cfg["add_eos_token"].is_boolean()) {
    v.add_eos_token = cfg["add_eos_token"].get<bool>();
  }
}

void convert_chat_template(const json& cfg, VocabData& v) {
  if (cfg.contains("chat_template")) {
    const json& t = cfg["chat_template"];
    if (t.is_string()) {
      v.chat_template = t.get<std::string>();
    } else if (t.is_array()) {
      for (const json& e : t) {
        if (e.value("name", "") == "default") v.chat_template = e.value("template", "");
      }
    }
  }
}

Expected<VocabData> convert(const json& tok, const json& cfg, std::optional<size_t> vocab_size) {
  VocabData v;
  KILN_TRY(const bool byte_level, convert_kind(tok, v));
  std::vector<AddedToken> added;
  KILN_TRY_STATUS(convert_tokens(tok, byte_level, vocab_size, v, added));
  if (v.model == "bert") {
    to_phantom_space(v);
  } else {
    KILN_TRY_STATUS(convert_merges(tok.at("model"), v));
    if (!byte_level) derive_scores(v);
  }
  convert_specials(tok, cfg, added, v);
  convert_chat_template(cfg, v);
  return v;
}

}  // namespace

Expected<VocabData> import_hf_tokenizer_json(std::string_view tokenizer_json,
                                             std::string_view config_json,
                                             std::optional<size_t> vocab_size) {
  const json tok = json::parse(tokenizer_json, nullptr, /*allow_exceptions=*/false);
  if (tok.is_discarded() || !tok.is_object()) return err("tokenizer.json is not a JSON object");
  const json cfg = config_json.empty() ? json::object() : json::parse(config_json, nullptr, false);
  if (cfg.is_discarded() || !cfg.is_object()) {
    return err("tokenizer_config.json is not a JSON object");
  }
  try {
    return convert(tok, cfg, vocab_size);
  } catch (const json::exception& e) {
    // A field of the wrong type or missing: report it instead of crashing.
    return err("tokenizer.json: unexpected structure: {}", e.what());
  }
}

Expected<VocabData> import_hf_tokenizer(const std::filesystem::path& dir,
                                        const std::filesystem::path& config_path) {
  KILN_TRY(std::string tok, read_file(dir / "tokenizer.json"));
  std::string cfg;
  if (std::filesystem::exists(dir / "tokenizer_config.json")) {
    KILN_TRY(cfg, read_file(dir / "tokenizer_config.json"));
  }
  std::optional<size_t> vocab_size;
  std::optional<int32_t> config_bos, config_eos;
  const std::filesystem::path config = config_path.empty() ? dir / "config.json" : config_path;
  if (!config_path.empty() || std::filesystem::exists(config)) {
    KILN_TRY(std::string text, read_file(config));
    const json c = json::parse(text, nullptr, false);
    if (c.is_object()) {
      auto get_id = [&](const char* key) -> std::optional<int64_t> {
        if (c.contains(key) && c[key].is_number_integer()) return c[key].get<int64_t>();
        return std::nullopt;
      };
      if (auto vs = get_id("vocab_size"); vs && *vs > 0) vocab_size = static_cast<size_t>(*vs);
      if (auto b = get_id("bos_token_id")) config_bos = static_cast<int32_t>(*b);
      if (auto e = get_id("eos_token_id")) config_eos = static_cast<int32_t>(*e);
    }
  }
  auto v = import_hf_tokenizer_json(tok, cfg, vocab_size);
  if (!v) return err("{}: {}", dir.string(), v.error().message);
  // config.json ids fill what tokenizer_config.json left unset (gguf-py SpecialVocab order).
  const auto n = static_cast<int32_t>(v->tokens.size());
  if (!v->bos_id && config_bos && *config_bos >= 0 && *config_bos < n) v->bos_id = config_bos;
  if (!v->eos_id && config_eos && *config_eos >= 0 && *config_eos < n) v->eos_id = config_eos;
  if (v->chat_template.empty() && std::filesystem::exists(dir / "chat_template.jinja")) {
    KILN_TRY(v->chat_template, read_file(dir / "chat_template.jinja"));
  }
  return v;
}

}  // namespace kiln::tokenizer
