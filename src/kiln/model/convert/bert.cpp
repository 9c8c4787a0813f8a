#include "kiln/model/convert/bert.h"

#include <algorithm>
#include <filesystem>
#include <memory>

#include "kiln/model/convert/safetensors.h"
#include "kiln/tokenizer/gguf_vocab.h"
#include "kiln/tokenizer/hf_import.h"

namespace kiln::model {
namespace fs = std::filesystem;
namespace {

std::string string_or(const nlohmann::json& c, const char* key, const char* fallback) {
  return c.contains(key) && c[key].is_string() ? c[key].get<std::string>() : fallback;
}

}  // namespace

Expected<uint32_t> config_positive_u32(const nlohmann::json& c, const char* key) {
  if (!c.contains(key) || !c[key].is_number_integer())
    return err("convert: config.json has no integer '{}'", key);
  const int64_t v = c[key].get<int64_t>();
  if (v <= 0 || v > (int64_t{1} << 30)) return err("convert: config.json {} = {}", key, v);
  return static_cast<uint32_t>(v);
}

Status write_wordpiece_vocab(gguf::Writer& w, const ConvertOptions& o, uint32_t n_vocab,
                             std::string_view model) {
  if (!o.with_tokenizer || !fs::exists(fs::path(o.hf_dir) / "tokenizer.json")) return {};
  KILN_TRY(tokenizer::VocabData vocab, tokenizer::import_hf_tokenizer(o.hf_dir));
  if (vocab.model != "bert")
    return err("convert: a {} model with a '{}' tokenizer is not supported", model, vocab.model);
  if (vocab.tokens.size() != n_vocab)
    return err("convert: tokenizer has {} tokens, config.json vocab_size is {}",
               vocab.tokens.size(), n_vocab);
  tokenizer::write_vocab(w, vocab);
  return {};
}

Status write_encoder_tensors(gguf::Writer& w, const std::string& hf_dir,
                             const std::vector<BertTensor>& tensors, const FileType& ft,
                             const HParams& hp) {
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  std::error_code ec;
  std::vector<fs::path> paths;
  for (const auto& e : fs::directory_iterator(hf_dir, ec))
    if (e.path().extension() == ".safetensors") paths.push_back(e.path());
  if (ec) return err("convert: cannot list '{}': {}", hf_dir, ec.message());
  if (paths.empty()) return err("convert: no .safetensors files in '{}'", hf_dir);
  std::sort(paths.begin(), paths.end());
  for (const fs::path& p : paths) {
    KILN_TRY(auto f, SafetensorsFile::open(p.string()));
    files.push_back(std::move(f));
  }
  // BertForMaskedLM prefixes the encoder's names with "bert.".
  auto read = [&](const std::string& name) -> Expected<std::vector<float>> {
    for (const std::string& n : {name, "bert." + name})
      for (const auto& f : files)
        if (f->find(n)) return f->read_f32(n);
    return err("convert: checkpoint has no tensor '{}'", name);
  };
  for (const BertTensor& t : tensors) {
    if (t.hf_name.empty()) continue;
    KILN_TRY(std::vector<float> values, read(t.hf_name));
    int64_t n = 1;
    for (int64_t x : t.spec.ne) n *= x;
    if (static_cast<int64_t>(values.size()) != n)
      return err("convert: '{}' ({}) has {} elements, expected {}", t.spec.name, t.hf_name,
                 values.size(), n);
    const quant::Type type =
        bert_tensor_always_f32(t.spec.name) ? quant::Type::F32 : tensor_type(ft, t.spec, hp);
    KILN_TRY_STATUS(add_tensor_f32(w, t.spec, type, values));
  }
  return {};
}

bool is_bert_config(const nlohmann::json& config) {
  if (!config.contains("architectures") || !config["architectures"].is_array() ||
      config["architectures"].empty() || !config["architectures"][0].is_string())
    return false;
  const std::string a = config["architectures"][0].get<std::string>();
  return a == "BertModel" || a == "BertForMaskedLM";
}

Expected<gguf::Writer> convert_bert(const ConvertOptions& o, const nlohmann::json& c) {
  BertDims d;
  KILN_TRY(d.n_vocab, config_positive_u32(c, "vocab_size"));
  KILN_TRY(d.n_embd, config_positive_u32(c, "hidden_size"));
  KILN_TRY(d.n_layer, config_positive_u32(c, "num_hidden_layers"));
  KILN_TRY(d.n_ff, config_positive_u32(c, "intermediate_size"));
  KILN_TRY(d.n_ctx_train, config_positive_u32(c, "max_position_embeddings"));
  KILN_TRY(const uint32_t n_head, config_positive_u32(c, "num_attention_heads"));
  d.n_token_types = 1;
  if (c.contains("type_vocab_size")) {
    KILN_TRY(d.n_token_types, config_positive_u32(c, "type_vocab_size"));
  }
  if (d.n_embd % n_head != 0)
    return err("convert: hidden_size {} is not a multiple of num_attention_heads {}", d.n_embd,
               n_head);
  if (const std::string act = string_or(c, "hidden_act", "gelu"); act != "gelu")
    return err("convert: BERT hidden_act '{}' is not supported (kiln: gelu, the erf form)", act);
  if (const std::string pos = string_or(c, "position_embedding_type", "absolute");
      pos != "absolute")
    return err("convert: BERT position_embedding_type '{}' is not supported (kiln: absolute)", pos);
  const float eps = c.contains("layer_norm_eps") && c["layer_norm_eps"].is_number()
                        ? c["layer_norm_eps"].get<float>()
                        : 1e-12f;
  KILN_TRY(FileType ft, parse_file_type(o.type));
  KILN_TRY(Pooling pooling, pooling_from_sentence_transformers(o.hf_dir));

  gguf::Writer w;
  w.set_string("general.architecture", "bert");
  w.set_string("general.name", fs::path(o.hf_dir).filename().string());
  w.set_uint32("general.file_type", ft.id);
  w.set_uint32("general.quantization_version", 2);
  w.set_uint32("bert.context_length", d.n_ctx_train);
  w.set_uint32("bert.embedding_length", d.n_embd);
  w.set_uint32("bert.feed_forward_length", d.n_ff);
  w.set_uint32("bert.block_count", d.n_layer);
  w.set_uint32("bert.attention.head_count", n_head);
  w.set_float32("bert.attention.layer_norm_epsilon", eps);
  w.set_bool("bert.attention.causal", false);
  if (pooling != Pooling::kNone) w.set_uint32("bert.pooling_type", static_cast<uint32_t>(pooling));
  w.set_uint32("tokenizer.ggml.token_type_count", d.n_token_types);
  KILN_TRY_STATUS(write_wordpiece_vocab(w, o, d.n_vocab, "BERT"));

  HParams hp;  // what tensor_type consults: the architecture and the layer count
  hp.arch = "bert";
  hp.n_layer = d.n_layer;
  hp.n_embd = d.n_embd;
  hp.n_vocab = d.n_vocab;
  KILN_TRY_STATUS(write_encoder_tensors(w, o.hf_dir, bert_tensors(d), ft, hp));
  return w;
}

}  // namespace kiln::model
