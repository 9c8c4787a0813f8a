#include "kiln/model/convert/nomic_bert.h"

#include <filesystem>
#include <string>

#include "kiln/model/arch/bert_tensors.h"
#include "kiln/model/convert/bert.h"
#include "kiln/model/file_type.h"

namespace kiln::model {
namespace fs = std::filesystem;
namespace {

// A config value, or the NomicBertConfig / GPT2Config default when absent or null.
bool bool_or(const nlohmann::json& c, const char* key, bool fallback) {
  return c.contains(key) && c[key].is_boolean() ? c[key].get<bool>() : fallback;
}
double number_or(const nlohmann::json& c, const char* key, double fallback) {
  return c.contains(key) && c[key].is_number() ? c[key].get<double>() : fallback;
}
bool set(const nlohmann::json& c, const char* key) {
  return c.contains(key) && !c[key].is_null();
}

// The switches of the published text models, checked as llama.cpp's converter asserts them
// (and the HF defaults a config may leave out: qkv_proj_bias, mlp_fc1_bias and mlp_fc2_bias
// default to true, rotary_emb_fraction to 0, activation_function to gelu_new).
Status check_supported(const nlohmann::json& c) {
  if (number_or(c, "moe_every_n_layers", 0) > 0 || number_or(c, "num_experts", 0) > 0)
    return err(
        "convert: nomic-bert-moe (moe_every_n_layers, nomic-embed-text-v2-moe) is not supported "
        "(kiln: nomic-bert, nomic-embed-text-v1 / v1.5)");
  const std::string act = c.contains("activation_function") && c["activation_function"].is_string()
                              ? c["activation_function"].get<std::string>()
                              : "gelu_new";
  if (act != "swiglu")
    return err("convert: nomic-bert activation_function '{}' is not supported (kiln: swiglu)", act);
  if (number_or(c, "rotary_emb_fraction", 0.0) != 1.0)
    return err("convert: nomic-bert rotary_emb_fraction {} is not supported (kiln: 1.0)",
               number_or(c, "rotary_emb_fraction", 0.0));
  if (bool_or(c, "rotary_emb_interleaved", false))
    return err("convert: nomic-bert rotary_emb_interleaved is not supported (kiln: rotate-half)");
  for (const char* key : {"rotary_emb_scale_base", "rotary_scaling_factor"})
    if (set(c, key)) return err("convert: nomic-bert {} is not supported (kiln: null)", key);
  for (const char* key : {"qkv_proj_bias", "mlp_fc1_bias", "mlp_fc2_bias"})
    if (bool_or(c, key, true))
      return err("convert: nomic-bert {} is not supported (kiln: false)", key);
  for (const char* key : {"prenorm", "causal", "use_rms_norm", "parallel_block"})
    if (bool_or(c, key, false))
      return err("convert: nomic-bert {} is not supported (kiln: false)", key);
  return {};
}

}  // namespace

bool is_nomic_bert_config(const nlohmann::json& config) {
  if (config.contains("model_type") && config["model_type"] == "nomic_bert") return true;
  return config.contains("architectures") && config["architectures"].is_array() &&
         !config["architectures"].empty() && config["architectures"][0] == "NomicBertModel";
}

Expected<gguf::Writer> convert_nomic_bert(const ConvertOptions& o, const nlohmann::json& c) {
  KILN_TRY_STATUS(check_supported(c));
  NomicBertDims d;
  KILN_TRY(d.n_vocab, config_positive_u32(c, "vocab_size"));
  KILN_TRY(d.n_embd, config_positive_u32(c, "n_embd"));
  KILN_TRY(d.n_layer, config_positive_u32(c, "n_layer"));
  KILN_TRY(d.n_ff, config_positive_u32(c, "n_inner"));
  KILN_TRY(const uint32_t n_head, config_positive_u32(c, "n_head"));
  KILN_TRY(const uint32_t n_positions, config_positive_u32(c, "n_positions"));
  d.n_token_types = 2;  // NomicBertConfig's default
  if (set(c, "type_vocab_size")) {
    KILN_TRY(d.n_token_types, config_positive_u32(c, "type_vocab_size"));
  }
  uint32_t max_trained = 2048;
  if (set(c, "max_trained_positions")) {
    KILN_TRY(max_trained, config_positive_u32(c, "max_trained_positions"));
  }
  // llama.cpp's context length: v1 and v1.5 say n_positions 8192 but were trained for 2048.
  if (n_positions != 8192 || max_trained != 2048)
    return err(
        "convert: nomic-bert n_positions {} / max_trained_positions {} not recognized "
        "(kiln: 8192 / 2048, nomic-embed-text-v1 / v1.5)",
        n_positions, max_trained);
  const uint32_t n_ctx_train = 2048;
  d.n_qkv = 3 * d.n_embd;
  if (d.n_embd % n_head != 0 || (d.n_embd / n_head) % 2 != 0)
    return err("convert: n_embd {} is not a multiple of n_head {} with an even head size", d.n_embd,
               n_head);
  // The gated MLP rounds its width up to a multiple of 256; the file's width is n_inner.
  if (d.n_ff % 256 != 0)
    return err("convert: nomic-bert n_inner {} is not a multiple of 256", d.n_ff);
  const double eps = number_or(c, "layer_norm_epsilon", 1e-5);  // GPT2Config's default
  const double rope_base = number_or(c, "rotary_emb_base", 10000.0);
  KILN_TRY(FileType ft, parse_file_type(o.type));
  KILN_TRY(Pooling pooling, pooling_from_sentence_transformers(o.hf_dir));

  gguf::Writer w;
  w.set_string("general.architecture", "nomic-bert");
  w.set_string("general.name", fs::path(o.hf_dir).filename().string());
  w.set_uint32("general.file_type", ft.id);
  w.set_uint32("general.quantization_version", 2);
  w.set_uint32("nomic-bert.context_length", n_ctx_train);
  w.set_uint32("nomic-bert.embedding_length", d.n_embd);
  w.set_uint32("nomic-bert.feed_forward_length", d.n_ff);
  w.set_uint32("nomic-bert.block_count", d.n_layer);
  w.set_uint32("nomic-bert.attention.head_count", n_head);
  w.set_float32("nomic-bert.rope.freq_base", static_cast<float>(rope_base));
  w.set_float32("nomic-bert.attention.layer_norm_epsilon", static_cast<float>(eps));
  w.set_bool("nomic-bert.attention.causal", false);
  if (pooling != Pooling::kNone)
    w.set_uint32("nomic-bert.pooling_type", static_cast<uint32_t>(pooling));
  w.set_uint32("tokenizer.ggml.token_type_count", d.n_token_types);
  KILN_TRY_STATUS(write_wordpiece_vocab(w, o, d.n_vocab, "nomic-bert"));

  HParams hp;  // what tensor_type consults: the architecture and the layer count
  hp.arch = "nomic-bert";
  hp.n_layer = d.n_layer;
  hp.n_embd = d.n_embd;
  hp.n_vocab = d.n_vocab;
  KILN_TRY_STATUS(write_encoder_tensors(w, o.hf_dir, nomic_bert_tensors(d), ft, hp));
  return w;
}

}  // namespace kiln::model
