#include "kiln/tokenizer/gguf_vocab.h"

namespace kiln::tokenizer {
namespace {

constexpr const char* kModel = "tokenizer.ggml.model";
constexpr const char* kPre = "tokenizer.ggml.pre";
constexpr const char* kTokens = "tokenizer.ggml.tokens";
constexpr const char* kTokenType = "tokenizer.ggml.token_type";
constexpr const char* kScores = "tokenizer.ggml.scores";
constexpr const char* kMerges = "tokenizer.ggml.merges";
constexpr const char* kAddBos = "tokenizer.ggml.add_bos_token";
constexpr const char* kAddEos = "tokenizer.ggml.add_eos_token";
constexpr const char* kAddSpacePrefix = "tokenizer.ggml.add_space_prefix";
constexpr const char* kChatTemplate = "tokenizer.chat_template";

struct IdKey {
  const char* key;
  std::optional<int32_t> VocabData::*field;
};
constexpr IdKey kIdKeys[] = {
    {"tokenizer.ggml.bos_token_id", &VocabData::bos_id},
    {"tokenizer.ggml.eos_token_id", &VocabData::eos_id},
    {"tokenizer.ggml.eot_token_id", &VocabData::eot_id},
    {"tokenizer.ggml.eom_token_id", &VocabData::eom_id},
    {"tokenizer.ggml.unknown_token_id", &VocabData::unk_id},
    {"tokenizer.ggml.padding_token_id", &VocabData::pad_id},
    {"tokenizer.ggml.seperator_token_id", &VocabData::sep_id},
    {"tokenizer.ggml.cls_token_id", &VocabData::cls_id},
    {"tokenizer.ggml.mask_token_id", &VocabData::mask_id},
};

struct FlagKey {
  const char* key;
  std::optional<bool> VocabData::*field;
};
constexpr FlagKey kFlagKeys[] = {
    {kAddBos, &VocabData::add_bos_token},
    {kAddEos, &VocabData::add_eos_token},
    {kAddSpacePrefix, &VocabData::add_space_prefix},
    {"kiln.tokenizer.bert.lowercase", &VocabData::bert_lowercase},
    {"kiln.tokenizer.bert.strip_accents", &VocabData::bert_strip_accents},
};

}  // namespace

Expected<VocabData> load_vocab(const gguf::File& file) {
  VocabData v;
  KILN_TRY(v.model, file.get_string(kModel));
  KILN_TRY(v.pre, file.get_string_or(kPre, ""));
  KILN_TRY(v.tokens, file.get_string_array(kTokens));
  const size_t n = v.tokens.size();
  if (file.has(kTokenType)) {
    KILN_TRY(std::vector<int64_t> types, file.get_int_array(kTokenType));
    if (types.size() != n) {
      return err("{} has {} entries for {} tokens", kTokenType, types.size(), n);
    }
    v.token_type.reserve(n);
    for (int64_t t : types) {
      if (t < 0 || t > 6) return err("{} holds unknown type {}", kTokenType, t);
      v.token_type.push_back(static_cast<int32_t>(t));
    }
  }
  if (file.has(kScores)) {
    KILN_TRY(v.scores, file.get_float_array(kScores));
    if (v.scores.size() != n)
      return err("{} has {} entries for {} tokens", kScores, v.scores.size(), n);
  }
  if (file.has(kMerges)) {
    KILN_TRY(v.merges, file.get_string_array(kMerges));
  }
  for (const IdKey& k : kIdKeys) {
    if (!file.has(k.key)) continue;
    KILN_TRY(int64_t id, file.get_int(k.key));
    // llama.cpp writes -1 (as uint32 0xFFFFFFFF in old files) for "none".
    if (id == -1 || id == 0xFFFFFFFFll) continue;
    if (id < 0 || static_cast<uint64_t>(id) >= n) {
      return err("{} = {} is outside the vocabulary of {} tokens", k.key, id, n);
    }
    v.*(k.field) = static_cast<int32_t>(id);
  }
  for (const FlagKey& k : kFlagKeys) {
    if (!file.has(k.key)) continue;
    KILN_TRY(bool b, file.get_bool(k.key));
    v.*(k.field) = b;
  }
  KILN_TRY(v.chat_template, file.get_string_or(kChatTemplate, ""));
  return v;
}

void write_vocab(gguf::Writer& w, const VocabData& v) {
  w.set_string(kModel, v.model);
  if (!v.pre.empty()) w.set_string(kPre, v.pre);
  w.set_string_array(kTokens, v.tokens);
  if (!v.token_type.empty()) w.set_int32_array(kTokenType, v.token_type);
  if (!v.scores.empty()) w.set_float_array(kScores, v.scores);
  if (!v.merges.empty()) w.set_string_array(kMerges, v.merges);
  for (const IdKey& k : kIdKeys) {
    if (const auto& id = v.*(k.field)) w.set_uint32(k.key, static_cast<uint32_t>(*id));
  }
  for (const FlagKey& k : kFlagKeys) {
    if (const auto& b = v.*(k.field)) w.set_bool(k.key, *b);
  }
  if (!v.chat_template.empty()) w.set_string(kChatTemplate, v.chat_template);
}

}  // namespace kiln::tokenizer
